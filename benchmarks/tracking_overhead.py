"""What MLflow tracking costs the training it records: the same bwopt run with tracking on and off.

Both sides are real bwopt runs (`bwopt.run.run`) of the default experiment (MLP 128 on the
digits, batch 64, pipeline=default), `train.epochs` x `train.steps_per_epoch` steps:

- tracking on: `tracking=mlflow` (the default preset: per-epoch metrics, system metrics sampled
  every 5 s in a background thread, params, tags, summary.json and config as artifacts at the
  end) with its store a sqlite file in a temporary folder;
- tracking off: `tracking=none`.

Before the rounds, one untimed run with tracking on creates the store (schema migrations, first
MLflow imports). The sides then alternate in rounds (in `_common.alternate`'s order).
Printed: each side's throughput of its timed steps as the run reports it (`_common.spread`: geometric
mean, 95 % interval, median, min-max), the
per-round ratio on / off (target >= 0.99), and, for information, the wall time of the whole
`run(...)` call (tracking adds its set-up and the final logging there, outside the timed steps).

Run: `.venv/bin/python benchmarks/tracking_overhead.py` (about 60 s on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` runs one short round (the smoke test).
"""

import tempfile
import time
from pathlib import Path

from _common import QUIET, SMOKE, alternate, compose, configure_devices, load_line, ratios, run_bwopt, spread, verdict

ROUNDS = 1 if SMOKE else 9
EPOCHS = 2 if SMOKE else 3
STEPS_PER_EPOCH = 30 if SMOKE else 400
WORKLOAD = [*QUIET, f"train.epochs={EPOCHS}", f"train.steps_per_epoch={STEPS_PER_EPOCH}", "train.warmup_steps=10"]
TARGET = 0.99


def main() -> None:
    print(
        f"tracking_overhead: bwopt runs of the default experiment, {EPOCHS} x {STEPS_PER_EPOCH} steps, "
        f"tracking=mlflow (sqlite store in a temporary folder) vs tracking=none, {ROUNDS} alternated rounds;\n"
        f"  {load_line()}",
        flush=True,
    )
    started_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        store = f"sqlite:///{Path(scratch) / 'mlflow.db'}"
        on = compose([*WORKLOAD, "tracking=mlflow", f"tracking.uri={store}", "tracking.experiment=benchmark"])
        off = compose([*WORKLOAD, "tracking=none"])
        configure_devices(off[0])
        run_bwopt(*on, Path(scratch) / "warm-up")
        walls = {"tracking on": [], "tracking off": []}

        def side(name, config):
            def measure():
                started = time.perf_counter()
                summary = run_bwopt(*config, Path(scratch) / "run")
                walls[name].append(time.perf_counter() - started)
                if name == "tracking on" and not summary.run_id:
                    raise RuntimeError("tracking on, but the run has no MLflow run id")
                return summary.figures.throughput_examples_per_s

            return measure

        results = alternate({"tracking on": side("tracking on", on), "tracking off": side("tracking off", off)}, ROUNDS)
    print(f"{ROUNDS} rounds, {time.perf_counter() - started_all:.0f} s")
    for name, values in results.items():
        print(f"  {name:<13} examples/s {spread(values, ',.0f')}  whole run {spread(walls[name], '.2f')} s")
    per_round = ratios(results["tracking on"], results["tracking off"])
    note = f"  target >= {TARGET}: {verdict(per_round, TARGET)}"
    print(f"ratio throughput tracking on/off: {spread(per_round)}{note}")
    print(f"ratio whole-run wall time tracking on/off: {spread(ratios(walls['tracking on'], walls['tracking off']))}")


if __name__ == "__main__":
    main()
