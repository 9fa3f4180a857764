"""What the classic tf.data optimisations pay on the same workload, through bwopt's own code path.

Every run is a real bwopt experiment: `python -m bwopt OVERRIDES` in a process of its own
(`_common.fresh_run`: tracking=none, no memcpy test, no progress bar), read back from its
summary.json; in one process a run measures its predecessors' leftovers (see `fresh_run`).
Each comparison runs its sides alternated round by round (in `_common.alternate`'s order);
every ratio printed is the geometric mean of the per-round ratios with its 95 % interval
(`_common.spread`), then their median and min-max.

(a) the input-bound preset, `experiment=pipelines` (conf/experiment/pipelines.yaml: 16,384
    synthetic uint8 32x32x3 images, 8 augmentation rounds per image on the host, MLP with one
    hidden layer of 64 at learning rate 3e-4, global batch 512, 3 epochs): pipeline=naive (serial map, no prefetch,
    autotune off, float32 transfer) against pipeline=tuned (cache, vectorised autotuned map,
    autotuned prefetch, uint8 transfer), tuned with `measure.ceilings=true`. Printed: the
    throughput ratio tuned / naive (target >= 1.8) and tuned's efficiency, i.e. its throughput ÷
    min(compute ceiling, input ceiling) as the run reports it (target >= 0.9).

(b) the workload `experiment=pipelines` had before (2,048 images, 4 augmentation rounds, the
    default MLP of 128 units, batch 128, 2 epochs), same two sides: input and compute cost about
    the same there, so on 2 shared cores they add up instead of overlapping (see benchmarks/README.md).
    Left out in smoke mode.

(c) a workload with known latencies: data=artificial (each element sleeps 1 ms in a generator,
    each train step sleeps 20 ms), split=uniform, pipeline=naive, no shuffle, global batch 16;
    pipeline.prefetch=0 against pipeline.prefetch=2. Without prefetch a step costs input +
    compute; with it the two overlap and a step costs max(input, compute). The observed ratio is
    printed next to the ratio predicted from the two latencies measured independently in the
    same round with plain perf_counter and none of bwopt's timing code: input = 48 batches of the
    same tf.data pipeline (prefetch 0) iterated alone; compute = 30 calls of the same train step
    (bwopt.train.make_step_functions, with its 20 ms sleep) on one batch, each read on the host.

The independent latencies of (c) are timed in this process, with the default device set-up.

Run: `.venv/bin/python benchmarks/pipeline_payoff.py` (about 7 min on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` runs one round of (a) shrunk and (c) (the smoke test).
"""

import statistics
import tempfile
import time
from pathlib import Path

from _common import QUIET, SMOKE, compose, configure_devices, fresh_run, load_line, ratios, spread, verdict

ROUNDS = 1 if SMOKE else 5
COMMON = ["tracking=none", *QUIET]
PRESET = ["experiment=pipelines"]
if SMOKE:  # one short run per side, the preset's shape otherwise
    PRESET += ["data.num_examples=2048", "train.global_batch_size=128", "train.epochs=2", "measure.ceiling_steps=20"]
EARLIER = [
    "data=synthetic",
    "data.num_examples=2048",
    "data.image_shape=[32,32,3]",
    "pipeline.augment_repeats=4",
    "train.global_batch_size=128",
    "train.epochs=2",
    "train.warmup_steps=3",
]
ARTIFICIAL_BATCH = 16
ELEMENT_S = 0.001
COMPUTE_S = 0.020
ARTIFICIAL = [
    "data=artificial",
    "split=uniform",
    "pipeline=naive",
    "pipeline.shuffle_buffer=0",
    "data.num_files=4",
    "data.examples_per_file=128",
    f"data.element_latency_s={ELEMENT_S}",
    f"data.step_compute_s={COMPUTE_S}",
    f"train.global_batch_size={ARTIFICIAL_BATCH}",
    "train.epochs=1",
    "train.warmup_steps=2",
    "model.hidden_units=[8]",
]
VARIANTS = {
    "preset, pipeline=naive": [*PRESET, "pipeline=naive"],
    "preset, pipeline=tuned": [*PRESET, "pipeline=tuned", "measure.ceilings=true"],
    "earlier, pipeline=naive": [*EARLIER, "pipeline=naive"],
    "earlier, pipeline=tuned": [*EARLIER, "pipeline=tuned", "measure.ceilings=true"],
    "artificial, prefetch=0": [*ARTIFICIAL, "pipeline.prefetch=0"],
    "artificial, prefetch=2": [*ARTIFICIAL, "pipeline.prefetch=2"],
}
if SMOKE:
    VARIANTS = {name: overrides for name, overrides in VARIANTS.items() if not name.startswith("earlier")}
INPUT_BATCHES = 48  # two passes over the 3 training files (24 batches each)
COMPUTE_STEPS = 30
TARGET_RATIO = 1.8
TARGET_EFFICIENCY = 0.9


def independent_latencies(config):
    """(input s per batch, compute s per step) of the artificial workload, timed without bwopt's timer."""
    import tensorflow as tf

    from bwopt.data.sources import load_artificial
    from bwopt.models import build_model, build_optimizer
    from bwopt.pipeline import build_dataset, file_elements
    from bwopt.train import StepSettings, make_step_functions

    source = load_artificial(config.data, config.seed, config.split.validation_fraction)
    elements = file_elements(config.pipeline, source.train_files, source.open_file)
    iterator = iter(build_dataset(config.pipeline, elements, ARTIFICIAL_BATCH, training=True, seed=config.seed))
    batch = next(iterator)
    started = time.perf_counter()
    for _ in range(INPUT_BATCHES):
        next(iterator)
    input_s = (time.perf_counter() - started) / INPUT_BATCHES

    strategy = tf.distribute.get_strategy()
    model = build_model(config.model, source.feature_shape, source.num_classes)
    optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
    optimizer.build(model.trainable_variables)
    steps = make_step_functions(
        strategy,
        model,
        optimizer,
        StepSettings(ARTIFICIAL_BATCH, source.feature_scale, step_compute_s=source.step_compute_s),
    )
    for _ in range(2):  # tracing
        [float(value) for value in steps.train_step(batch)]
    started = time.perf_counter()
    for _ in range(COMPUTE_STEPS):
        [float(value) for value in steps.train_step(batch)]
    compute_s = (time.perf_counter() - started) / COMPUTE_STEPS
    return input_s, compute_s


def main() -> None:
    started_all = time.perf_counter()
    print_header()
    artificial, _ = compose([*COMMON, *VARIANTS["artificial, prefetch=0"]])
    configure_devices(artificial)
    runs = iter(range(ROUNDS * len(VARIANTS)))
    summaries = {name: [] for name in VARIANTS}
    predicted = []
    pairs = [list(VARIANTS)[index : index + 2] for index in range(0, len(VARIANTS), 2)]
    with tempfile.TemporaryDirectory() as scratch:
        for round_number in range(ROUNDS):
            for pair in pairs:
                for name in pair if round_number % 2 == 0 else reversed(pair):
                    run = Path(scratch) / str(next(runs))
                    summaries[name].append(fresh_run([*COMMON, *VARIANTS[name]], run))
            predicted.append(independent_latencies(artificial))
    report(summaries, predicted, time.perf_counter() - started_all)


def print_header() -> None:
    lines = [
        "pipeline_payoff: bwopt runs (each python -m bwopt in a process of its own, tracking=none) side by side,",
        f"  {ROUNDS} alternated rounds; ratio = geometric mean of the per-round throughput ratios "
        f"(95 % CI; median, min-max); {load_line()}",
        "  (a) experiment=pipelines: pipeline=tuned (with measure.ceilings=true) vs pipeline=naive",
        "  (b) the preset's earlier workload (4 augment rounds, MLP 128, batch 128, 2,048 images): tuned vs naive",
        f"  (c) artificial, {ELEMENT_S * 1e3:g} ms/element, {COMPUTE_S * 1e3:g} ms/step, batch {ARTIFICIAL_BATCH}, "
        + "pipeline=naive: prefetch=2 vs prefetch=0,",
        "      next to the ratio (input+compute)/max(input,compute) predicted from latencies timed alone",
    ]
    print("\n".join(lines), flush=True)


def report(summaries, predicted, wall_s: float) -> None:
    throughput = {name: [s.figures.throughput_examples_per_s for s in runs] for name, runs in summaries.items()}
    print(f"{ROUNDS} rounds, {wall_s:.0f} s")
    for name, runs in summaries.items():
        stall = statistics.median(s.figures.input_stall_fraction or 0.0 for s in runs)
        print(f"  {name:<26} examples/s {spread(throughput[name], ',.0f')}  input stall {stall:6.1%}")
        if "measure.ceilings=true" in VARIANTS[name]:
            for key in ("compute_ceiling", "input_ceiling"):
                values = [s.measurements[f"{key}_examples_per_s"] for s in runs]
                half_range = statistics.median(s.measurements[f"{key}_spread"] for s in runs)
                name_text = key.replace("_", " ")
                print(f"    {name_text:<16} examples/s {spread(values, ',.0f')}  (± {half_range:.0%} in a run)")
    for workload in ("preset", "earlier"):
        if f"{workload}, pipeline=tuned" not in summaries:
            continue
        tuned, naive = f"{workload}, pipeline=tuned", f"{workload}, pipeline=naive"
        per_round = ratios(throughput[tuned], throughput[naive])
        efficiency = [s.measurements["efficiency"] for s in summaries[tuned]]
        label = "experiment=pipelines" if workload == "preset" else "earlier workload"
        note = f"  target >= {TARGET_RATIO}: {verdict(per_round, TARGET_RATIO)}"
        print(f"ratio {label} throughput tuned/naive: {spread(per_round, '.2f')}{note}")
        note = f"  target >= {TARGET_EFFICIENCY}: {verdict(efficiency, TARGET_EFFICIENCY)}"
        print(f"ratio {label} tuned throughput / min(ceilings): {spread(efficiency, '.2f')}{note}")
    input_s = statistics.median(p[0] for p in predicted)
    compute_s = statistics.median(p[1] for p in predicted)
    expected = statistics.median((i + c) / max(i, c) for i, c in predicted)
    print(
        f"  artificial, measured independently: input {input_s * 1e3:.2f} ms/batch, "
        f"compute {compute_s * 1e3:.2f} ms/step (medians over rounds)"
    )
    per_round = ratios(throughput["artificial, prefetch=2"], throughput["artificial, prefetch=0"])
    print(
        f"ratio artificial throughput prefetch=2/prefetch=0: {spread(per_round, '.2f')}"
        f" (predicted (input+compute)/max(input,compute): {expected:.2f})"
    )


if __name__ == "__main__":
    main()
