"""What `tune=pipeline` pays: its result re-measured side by side against the start and the alternatives.

1. The tuning itself, as users run it: `python -m bwopt -m tune=pipeline WORKLOAD pipeline=naive`
   in a fresh process (bwopt's launcher: every run a fresh process, two per trial and the
   incumbent twice more beside each candidate; tracking=none), timed by the wall clock; its
   tuned.yaml, number of runs, closing line and table (the reasons left out) are read back.
2. Optionally (`--search N`) the Optuna search over the same workload, `hparams_search=pipeline`
   with N trials, its best overrides read from search.yaml; or (`--search-best OVERRIDES`) the
   best overrides an earlier search named, re-measured beside the rest.
3. The final configurations re-measured side by side, every side once per round in a seeded
   random order (`_common.alternate`), each run `python -m bwopt` in a fresh process as the
   tuning's trials are (`measure.ceilings=true`, tracking=none):
   - start: the workload with pipeline=naive;
   - tune: the overrides of tuned.yaml;
   - autotune everything: pipeline=naive with every parallelism and prefetch `autotune` and
     tf.data's autotuner on, nothing else changed;
   - pipeline=tuned: the preset of every classic optimisation;
   - search: the search's best (with --search).
   Printed: each side's throughput, tune's per-round ratio to each other side (`_common.spread`:
   geometric mean, its 95 % interval, median, min-max) against its target, tune's throughput ÷ min(ceilings) (the
   compute, input and cores ceilings, as tune's table reads it; also ÷ min(compute, input), the
   run's efficiency), and each side's throughput ÷ its cores ceiling (what the step and the
   pipeline reach together on the cores they share).

Targets: tune ÷ start ≥ 1, tune ≥ 0.9 of min(ceilings), tune ≥ 1.2 × autotune
everything (where caching or placement matters), tune ≥ pipeline=tuned, tune ≥ search's best.
Also printed: whether the re-measured tune ÷ start lies within the interval of the gain tune's
closing line claimed, and whether tune's val_accuracy is within `sweep.accuracy_tolerance` (0.03)
of the start's.

Run: `.venv/bin/python benchmarks/tune_payoff.py [--workload pipelines|imagenet_like] [--search N]
[--rounds K] [--allow CHANGE ...] [--tune SETTING ...]` (`--allow decode`: tune's
`hydra.sweeper.allow=[decode]`; `--tune hydra.sweeper.target_fraction=0.97`: its own settings;
pipelines: about 10 min on 2 cores; imagenet_like: about 15 min).
`BWOPT_BENCHMARK_SMOKE=1` runs a one-trial tuning of a shrunk workload and one round (the smoke test).
"""

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from _common import QUIET, SMOKE, alternate, bwopt_process, fresh_run, load_line, ratios, spread, typical, verdict

WORKLOADS = {
    "pipelines": ["experiment=pipelines"],
    "imagenet_like": ["experiment=imagenet_like"],
}
SHRUNK = ["data.num_examples=2048", "train.global_batch_size=128", "train.epochs=1", "measure.ceiling_steps=10"]
AUTOTUNE_EVERYTHING = [
    "pipeline.map_parallelism=autotune",
    "pipeline.prefetch=autotune",
    "pipeline.interleave.cycle_length=autotune",
    "pipeline.interleave.num_parallel_calls=autotune",
    "pipeline.tfrecord.num_parallel_reads=autotune",
    "pipeline.options.autotune=true",
]
TARGETS = {"start": 1.0, "autotune everything": 1.2, "pipeline=tuned": 1.0, "search": 1.0}
TARGET_OF_CEILING = 0.9
ACCURACY_TOLERANCE = 0.03  # sweep.accuracy_tolerance's default
CLAIMED_GAIN = re.compile(r"×([\d.]+) over the start \(95 % CI ×([\d.]+)–×([\d.]+)\)")


def bwopt_sweep(arguments, folder: Path) -> float:
    """`python -m bwopt -m ARGUMENTS` with its sweep in `folder`; returns its wall time in seconds."""
    started = time.perf_counter()
    bwopt_process(["-m", *arguments, "tracking=none", f"hydra.sweep.dir={folder}"], folder.parent)
    return time.perf_counter() - started


def tune(workload, folder: Path, max_trials: int, allow=(), extra=()):
    smoke = ["hydra.sweeper.probe=false", "hydra.sweeper.repeats=1"] if SMOKE else []
    settings = [f"hydra.sweeper.max_trials={max_trials}", *smoke, *extra]
    settings += [f"hydra.sweeper.allow=[{','.join(allow)}]"] if allow else []
    wall_s = bwopt_sweep(["tune=pipeline", *workload, "pipeline=naive", *settings], folder)
    tuned = (folder / "tuned.yaml").read_text().split()
    report = (folder / "tune.md").read_text()
    closing = report.splitlines()[0].strip("*")
    # the trials as tune.md tables them, the reasons left out: trial, change, throughput, x start, kept, runs
    rows = [line.split(" | ") for line in report.splitlines() if line.startswith("| ") and "| trial |" not in line]
    rows = [cells for cells in rows if len(cells) >= 8]  # the trials' table, not the stages'
    trials = [" | ".join([cells[0].lstrip("| "), cells[1], *cells[3:]]).rstrip(" |") for cells in rows]
    runs = len([path for path in folder.iterdir() if path.is_dir() and path.name.isdigit()])
    return tuned, closing, runs, wall_s, trials


def search(workload, folder: Path, num_trials: int):
    wall_s = bwopt_sweep(["hparams_search=pipeline", *workload, f"hydra.sweeper.n_trials={num_trials}"], folder)
    (best,) = yaml.safe_load((folder / "search.yaml").read_text())["best"]
    return [item for item in best["overrides"] if not item.startswith("hparams_search=")], wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="pipelines")
    parser.add_argument("--search", type=int, default=0, metavar="N", help="also run a search of N trials")
    parser.add_argument("--rounds", type=int, default=1 if SMOKE else 3)
    parser.add_argument("--allow", nargs="*", default=[], metavar="CHANGE", help="tune's hydra.sweeper.allow")
    parser.add_argument("--search-best", nargs="+", metavar="OVERRIDE", help="an earlier search's best, re-measured")
    parser.add_argument(
        "--tune", nargs="+", default=[], metavar="SETTING", help="tune's own settings (hydra.sweeper.*)"
    )
    arguments = parser.parse_args()
    workload = [*WORKLOADS[arguments.workload], *(SHRUNK if SMOKE else [])]
    allowed = f", tune allowing {', '.join(arguments.allow)}" if arguments.allow else ""
    allowed += f", tune with {' '.join(arguments.tune)}" if arguments.tune else ""
    rounds = f"{arguments.rounds} alternated round(s)"
    print(f"tune_payoff: {arguments.workload}{allowed}, {rounds}; {load_line()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bwopt-tune-payoff-") as scratch:
        scratch = Path(scratch)
        tuned, closing, runs, tune_s, trials = tune(
            workload, scratch / "tune", 1 if SMOKE else 5, arguments.allow, arguments.tune
        )
        print(f"tune: {runs} run(s), {tune_s:.0f} s: {closing}")
        for line in trials:
            print(f"  trial {line}")
        print(f"  tuned.yaml: {' '.join(tuned)}", flush=True)
        sides = {
            "start": [*workload, "pipeline=naive"],
            "tune": tuned,
            "autotune everything": [*workload, "pipeline=naive", *AUTOTUNE_EVERYTHING],
            "pipeline=tuned": [*workload, "pipeline=tuned"],
        }
        if arguments.search:
            best, search_s = search(workload, scratch / "search", arguments.search)
            print(f"search: {arguments.search} trials, {search_s:.0f} s; best: {' '.join(best)}", flush=True)
            sides["search"] = best
        elif arguments.search_best:
            print(f"search (an earlier one's best): {' '.join(arguments.search_best)}", flush=True)
            sides["search"] = arguments.search_best
        measured = remeasure(sides, arguments.rounds, scratch / "run")
    report(measured)
    print(reproduced(closing, measured))


def remeasure(sides, rounds: int, folder: Path):
    """Each side's Summary over `rounds` rounds, every side once per round in a seeded random order
    (`_common.alternate`), every run a fresh `python -m bwopt` process (`_common.fresh_run`) as
    the tuning's trials are."""
    common = ["tracking=none", "measure.ceilings=true", *QUIET]
    numbers = iter(range(rounds * len(sides)))

    def side(overrides):
        return lambda: fresh_run([*overrides, *common], folder / str(next(numbers)))

    return alternate({name: side(overrides) for name, overrides in sides.items()}, rounds)


def report(summaries) -> None:
    throughput = {name: [s.figures.throughput_examples_per_s for s in runs] for name, runs in summaries.items()}
    for name, values in throughput.items():
        accuracy = [s.final_metrics["val_accuracy"] for s in summaries[name] if "val_accuracy" in s.final_metrics]
        shown = f"  val_accuracy {min(accuracy):.3f}-{max(accuracy):.3f}" if accuracy else ""
        print(f"  {name:<20} examples/s {spread(values, ',.0f')}{shown}")
    for name, target in TARGETS.items():
        if name in throughput:
            per_round = ratios(throughput["tune"], throughput[name])
            note = f"target >= {target:g}: {verdict(per_round, target)}"
            print(f"ratio tune / {name}: {spread(per_round, '.2f')}  {note}")
    # The lowest ceiling each run measured, the cores one included, as tune's table reads it: the
    # ratio to the lowest is the highest of the ratios to each.
    of_ceiling = [max(of_each(s)) for s in summaries["tune"]]
    note = f"target >= {TARGET_OF_CEILING:g}: {verdict(of_ceiling, TARGET_OF_CEILING)}"
    print(f"ratio tune throughput / min(ceilings) (compute, input, cores): {spread(of_ceiling, '.2f')}  {note}")
    of_two = [s.measurements["efficiency"] for s in summaries["tune"]]
    print(f"ratio tune throughput / min(compute, input ceilings), the efficiency: {spread(of_two, '.2f')}")
    # Where the step and the pipeline share the cores, what they reach together (bwopt.measure.ceilings).
    for name, runs in summaries.items():
        of_cores = [s.measurements["cores_efficiency"] for s in runs if "cores_efficiency" in s.measurements]
        if of_cores:
            cores = [s.measurements["cores_ceiling_examples_per_s"] for s in runs]
            print(f"  {name:<20} / cores ceiling {spread(of_cores, '.2f')}  (cores ceiling {spread(cores, ',.0f')})")


def reproduced(closing: str, summaries) -> str:
    """Whether the side-by-side runs reproduce what the tuning claimed: its gain within the interval
    of its closing line (printed to one decimal, so read ±0.05 wide), or, where it kept nothing,
    the start within noise of itself; and tune's val_accuracy no more than the tolerance below the
    start's."""
    throughput = {name: [s.figures.throughput_examples_per_s for s in summaries[name]] for name in ("tune", "start")}
    per_round = ratios(throughput["tune"], throughput["start"])
    claimed = CLAIMED_GAIN.search(closing)
    if claimed:
        gain, low, high = (float(value) for value in claimed.groups())
        inside = low - 0.05 <= typical(per_round) <= high + 0.05
        gain_text = (
            f"re-measured tune / start ×{typical(per_round):.2f}, the tuning's ×{gain:g} (95 % CI ×{low:g}–×{high:g}): "
            f"{'within' if inside else 'outside'} its interval"
        )
    elif "no change" in closing:
        same = verdict(per_round, 1.0) != "target missed" and verdict(per_round, 1.0, higher_is_better=False) != (
            "target missed"
        )
        gain_text = (
            f"the tuning kept no change, the same configuration re-measured: {spread(per_round, '.2f')}: "
            f"{'within noise of 1' if same else 'apart beyond the noise'}"
        )
    else:
        return f"reproduced: nothing to compare (the tuning's line: {closing})"
    accuracy = {
        name: statistics.median(s.final_metrics["val_accuracy"] for s in summaries[name])
        for name in ("tune", "start")
        if all("val_accuracy" in s.final_metrics for s in summaries[name])
    }
    if len(accuracy) < 2:
        return f"reproduced: {gain_text}; no val_accuracy to compare"
    close = accuracy["tune"] >= accuracy["start"] - ACCURACY_TOLERANCE
    return (
        f"reproduced: {gain_text}; val_accuracy (median) tune {accuracy['tune']:.3f}, start {accuracy['start']:.3f}: "
        f"{'not' if close else 'more than'} {ACCURACY_TOLERANCE:g} below"
    )


def of_each(summary):
    """The run's throughput over each ceiling it measured: compute and input (`efficiency` is over the
    lower of them) and the cores ceiling where the step and the pipeline share the cores."""
    return [summary.measurements[key] for key in ("efficiency", "cores_efficiency") if key in summary.measurements]


if __name__ == "__main__":
    main()
