"""What the benchmark scripts share: smoke mode, composing the real conf/, one bwopt run, rounds, reports.

Not a benchmark itself (run_all.py skips files whose name starts with "_"). Every script
imports it as `_common` (the script's own folder is first on sys.path when it is run directly).

- `SMOKE`: `BWOPT_BENCHMARK_SMOKE=1` asks for the short form the smoke tests run.
- `compose(overrides)`: the real conf/ plus overrides, as `python -m bwopt` would compose it,
  validated by `bwopt.app.validate`; returns (Config, resolved dict) for `bwopt.modes.run`.
- `run_bwopt(config, resolved, folder)`: one real bwopt run in this process, its printed summary
  swallowed; returns its `Summary` (raises when the run did not finish).
- `fresh_run(overrides, folder)`: one real `python -m bwopt` run in a process of its own (what
  configurations compared side by side take: a run measures its predecessors' leftovers in one
  process); its `Summary`. `bwopt_process(arguments, cwd)`: any `python -m bwopt` command.
- `alternate(sides, rounds)`: every side once per round; two sides in ABBA order, so a drift in
  machine speed hits both alike; three or more in a new seeded random order each round, so no side
  always follows the same one (the side before can slow the next: its pipeline refills the buffers
  its block drained on the same cores); returns each side's values.
- `spread(values)` / `ratios(a, b)`: "G (95 % CI; median, min, max)" text (G the geometric mean
  and the interval Student's t on the logs: `typical`, `interval95`), and
  per-round ratios a/b; `verdict(values, target)` says "target met" only when the interval
  clears the target, "target missed" when it lies on the wrong side, else "within noise of the
  target".
"""

import contextlib
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from bwopt.quiet import quiet  # imports no TensorFlow

# Benchmarks print their own lines only, as a run does: TensorFlow's start-up chatter is dropped
# (bwopt.quiet); BWOPT_BENCHMARK_VERBOSE=1 shows everything the libraries print.
quiet(verbose=os.environ.get("BWOPT_BENCHMARK_VERBOSE") == "1")

SMOKE = os.environ.get("BWOPT_BENCHMARK_SMOKE") == "1"
# What every benchmark run leaves out: its own memcpy test and progress line (unless asked).
QUIET = ["measure.memcpy_bandwidth=false", "measure.progress=false"]


def compose(overrides: Sequence[str]):
    """(validated Config, resolved dict) of the real conf/ plus `overrides`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from bwopt.app import config_dir, validate

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return validate(cfg), OmegaConf.to_container(cfg, resolve=True)


def configure_devices(config) -> None:
    """TensorFlow fixes its devices once per process: call once, before the first run."""
    from bwopt.devices import configure

    configure(config.device)


def run_bwopt(config, resolved, folder: Path):
    """One bwopt run (`bwopt.modes.run`); returns its Summary. Its printed summary is discarded."""
    from bwopt.modes import run

    with contextlib.redirect_stdout(io.StringIO()):
        return finished(run(config, output_dir=Path(folder), resolved=resolved), folder)


def finished(summary, folder: Path):
    """`summary`, raising where the run in `folder` did not finish with figures."""
    if summary.status != "FINISHED" or summary.figures is None:
        raise RuntimeError(f"bwopt run in {folder} ended {summary.status} with figures {summary.figures}")
    return summary


REPO = Path(__file__).resolve().parent.parent


def bwopt_process(arguments: Sequence[str], cwd: Path) -> None:
    """`python -m bwopt ARGUMENTS` in a fresh process in `cwd`, its own output left out."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "bwopt", *arguments], cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=env)


def fresh_run(overrides: Sequence[str], folder: Path):
    """`python -m bwopt OVERRIDES` in a process of its own, its run in `folder`; its Summary (raises
    when the run did not finish). Runs one after the other in one process measure each other's
    leftovers: on 2026-12-07 (idle, AMD EPYC, 2 cores) `experiment=pipelines pipeline=naive
    pipeline.vectorized_map=true` read 10,900-14,000 examples/s over three in-process rounds and
    21,200-22,200 over three in processes of their own 20 minutes later (`pipeline=tuned`
    16,100-18,800 and 21,300-21,900)."""
    from bwopt.summary import Summary

    folder.parent.mkdir(parents=True, exist_ok=True)
    bwopt_process([*overrides, f"hydra.run.dir={folder}"], folder.parent)
    return finished(Summary.from_dict(json.loads((folder / "summary.json").read_text())), folder)


def alternate(sides: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, List[object]]:
    """Each side's results over `rounds` rounds, every side once per round: two sides ABBA..., more
    in a seeded random order per round. With four sides in a fixed ABCD DCBA order, bwopt / plain
    loop read 0.958 (95 % CI 0.941-0.977) where a random order read 0.996 (0.970-1.005): in that
    order one side always ran after the same, heavier neighbour."""
    order = random.Random(0)
    results: Dict[str, List[object]] = {name: [] for name in sides}
    for round_number in range(rounds):
        names = list(sides)
        if len(names) == 2:
            names = names if round_number % 2 == 0 else names[::-1]
        else:
            order.shuffle(names)
        for name in names:
            results[name].append(sides[name]())
    return results


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> List[float]:
    """Per-round ratios numerator / denominator."""
    return [a / b for a, b in zip(numerators, denominators)]


def interval95(values: Sequence[float]) -> List[float]:
    """[low, high]: the 95 % interval of the typical value of `values` (rounds are independent):
    Student's t on their logs (all positive: throughputs, ratios, seconds; bwopt's own
    `log_estimate`, as a sweep compares repeats), else on the values, so that with few rounds it is
    as wide as they scatter. A bootstrap of the median was used
    before: with 3-5 rounds it is their min-max, which holds the median only 75-94 % of the time
    (a tuning's start configuration once read x1.08, 95 % CI x1.03-x1.09, against itself)."""
    from bwopt.measure.uncertainty import Z_95, log_estimate, t_quantile

    if len(values) < 2:
        return [float(values[0]), float(values[0])]
    if all(value > 0 for value in values):
        mean, error = log_estimate(values, [None] * len(values))  # error: t / 1.96 x the standard error
        return [math.exp(mean - Z_95 * error), math.exp(mean + Z_95 * error)]
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return [statistics.mean(values) - half, statistics.mean(values) + half]


def typical(values: Sequence[float]) -> float:
    """The value `interval95` is drawn around: the geometric mean of positive values, else the mean.
    Printed as the point estimate: beside an interval of the mean of the logs, the median can lie
    outside it (per-round ratios with a few slow rounds read median 0.642, 95 % CI 0.648-0.745)."""
    if all(value > 0 for value in values):
        return math.exp(statistics.mean(math.log(value) for value in values))
    return statistics.mean(values)


def spread(values: Sequence[float], fmt: str = ",.3f") -> str:
    """'G (95 % CI L–H; median M, min A, max B)' of `values`: G is `typical`, the interval `interval95`."""
    low, high = interval95(values)
    return (
        f"{typical(values):{fmt}} (95 % CI {low:{fmt}}–{high:{fmt}}; median {statistics.median(values):{fmt}}, "
        f"min {min(values):{fmt}}, max {max(values):{fmt}})"
    )


def verdict(values, target: float, higher_is_better: bool = True) -> str:
    """On `interval95`, the interval of the typical value: 'target met' when it clears the target,
    'target missed' when it lies wholly on the wrong side, else 'within noise of the target'. A
    single value is its own interval."""
    low, high = interval95([values] if isinstance(values, (int, float)) else values)
    if not higher_is_better:
        low, high, target = -high, -low, -target
    if low >= target:
        return "target met"
    if high < target:
        return "target missed"
    return "within noise of the target"


def load_line() -> str:
    """The machine's load averages, printed next to the figures (other work shares the cores)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"
