"""What `tune` writes: each trial as read from its job folder, the comparisons with their noise, the
table, the closing line and tuned.yaml (the plot of the path: bwopt.sweep.tune_plot). No TensorFlow.

A trial's figures come from its job folder (bwopt.sweep.results): throughput and its 95 % interval,
the ceilings and efficiency (`measure.ceilings=true` in every trial), the step partition, the
final val_accuracy, the job's wall time (job.json) and the CPU time its process used (getrusage
of the sweeper's children around its launch, so start-up and the ceilings' blocks count too).
"""

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from bwopt.measure.uncertainty import (
    CONFIDENCE,
    Z_95,
    Comparison,
    compare,
    log_estimate,
    pooled_log_spread,
    t_over_z,
)
from bwopt.sweep.results import read_job, read_summary

TABLE_HEADER = (
    "| trial | change | reason | throughput, examples/s (95 % CI) | × start | of min(ceilings) | kept "
    "| runs (job folders) |\n"
    "|---|---|---|---|---|---|---|---|"
)


@dataclass
class Trial:
    """One tuning trial: what it changed and what it measured.

    Attributes:
        number: its number (0: the start).
        change: the proposal's name ("start" for the first).
        reason: why it was proposed, with numbers.
        overrides: tune's own overrides it ran with (key -> value), on top of the workload's.
        throughput, ci95: examples/s and its 95 % interval (None when the job failed); with several
            repeats, their median and the interval of their mean (`estimate`).
        repeats: (examples/s, its run's 95 % interval) of each finished run.
        folders, blocks: the job folders of its runs in launch order (its repeats, and an
            incumbent's runs beside later candidates), and the round each ran in (a block: a
            candidate's repeats and the incumbent's run among them, a few minutes that share the
            machine's state; `drift_spread` measures how blocks differ). Without extra rounds a
            trial's own round is its number.
        repeat_blocks: the block of each finished run (beside `repeats`).
        compute_ceiling, input_ceiling, cores_ceiling: examples/s (None when not measured; the
            cores ceiling is what the step and the pipeline sustain together on the cores they share).
        cores_busy, cores_available: the cores its training kept busy, measured over its timed
            steps, and the cores it had (None when not measured).
        step_partition: part -> share of step time.
        val_accuracy: the final validation accuracy.
        wall_s, cpu_s: the job's processes (every repeat), start to end.
        kept: it beat the incumbent beyond the noise (the start is kept).
        against_incumbent: the comparison that decided, when there was one.
        note: why it was reverted, or other words for the table.
    """

    number: int
    change: str
    reason: str
    overrides: Dict[str, str]
    throughput: Optional[float] = None
    ci95: Optional[List[float]] = None
    compute_ceiling: Optional[float] = None
    input_ceiling: Optional[float] = None
    cores_ceiling: Optional[float] = None
    cores_busy: Optional[float] = None
    cores_available: Optional[float] = None
    step_partition: Dict[str, float] = field(default_factory=dict)
    val_accuracy: Optional[float] = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    kept: bool = False
    against_incumbent: Optional[Comparison] = None
    note: str = ""
    repeats: List[Tuple[float, Optional[List[float]]]] = field(default_factory=list)
    folders: List[Path] = field(default_factory=list)
    blocks: List[int] = field(default_factory=list)
    repeat_blocks: List[int] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.throughput is None

    @property
    def run_blocks(self) -> List[int]:
        """The block of each finished run (beside `repeats`); runs read without blocks are its own."""
        return self.repeat_blocks or [self.number] * len(self.repeats)

    @property
    def ceilings(self) -> Dict[str, float]:
        """The measured ceilings by name ("input ceiling", ...), lowest first."""
        named = {
            "input ceiling": self.input_ceiling,
            "compute ceiling": self.compute_ceiling,
            "cores ceiling": self.cores_ceiling,
        }
        return dict(sorted(((name, value) for name, value in named.items() if value), key=lambda item: item[1]))

    @property
    def ceiling(self) -> Optional[float]:
        """The lowest measured ceiling: what this trial's settings can reach at most."""
        return next(iter(self.ceilings.values()), None)

    @property
    def ceiling_name(self) -> str:
        return next(iter(self.ceilings), "compute ceiling")

    @property
    def of_ceiling(self) -> Optional[float]:
        return self.throughput / self.ceiling if self.throughput and self.ceiling else None

    def overrides_text(self) -> List[str]:
        return [f"{key}={value}" for key, value in self.overrides.items()]

    def estimate(self, pooled: Optional[Tuple[float, int]] = None, level: float = CONFIDENCE) -> Tuple[float, float]:
        """(mean log throughput, its standard error) over the finished repeats, their run-to-run spread
        `pooled` over the tuning's trials when measured (bwopt.measure.uncertainty.log_estimate)."""
        repeats = self.repeats or [(self.throughput, self.ci95)]
        values, intervals = [value for value, _ in repeats], [interval for _, interval in repeats]
        return log_estimate(values, intervals, pooled, level)

    def in_block(self, block: int) -> "Trial":
        """This trial with only its finished runs of round `block`."""
        kept = [run for run, run_block in zip(self.repeats, self.run_blocks) if run_block == block]
        return replace(self, repeats=kept, repeat_blocks=[block] * len(kept))


def read_trial(folder: Path, trial: Trial) -> Trial:
    """`trial` with the figures of its job folder filled in."""
    job = read_job(folder)
    summary = read_summary(folder) or {}
    measurements = summary.get("measurements") or {}
    figures = summary.get("figures") or {}
    trial.throughput, trial.ci95 = job.throughput, job.throughput_ci95
    trial.compute_ceiling = measurements.get("compute_ceiling_examples_per_s")
    trial.input_ceiling = measurements.get("input_ceiling_examples_per_s")
    trial.cores_ceiling = measurements.get("cores_ceiling_examples_per_s")
    trial.cores_busy, trial.cores_available = figures.get("cores_busy"), measurements.get("cores_available")
    trial.step_partition = figures.get("step_partition") or {}
    trial.val_accuracy = job.val_accuracy
    return trial


MEDIANS = ("throughput", "compute_ceiling", "input_ceiling", "cores_ceiling", "cores_busy", "val_accuracy")


def read_repeats(folders: Sequence[Path], trial: Trial, blocks: Optional[Sequence[int]] = None) -> Trial:
    """`trial` from the job folders of its runs (each of block `blocks[i]`; by default its own
    number): the medians of the finished ones' throughputs (as the launcher folds a sweep's
    repeats), ceilings and accuracies, and each one's throughput with its run's interval and its
    block; the step's partition from the first that finished."""
    blocks = list(blocks) if blocks is not None else [trial.number] * len(folders)
    reads = [read_trial(folder, replace(trial)) for folder in folders]
    finished = [read for read in reads if not read.failed]
    first = finished[0] if finished else reads[0]
    for name in Trial.__dataclass_fields__:
        if name not in ("number", "change", "reason", "overrides"):
            setattr(trial, name, getattr(first, name))
    trial.repeats = [(read.throughput, read.ci95) for read in finished]
    trial.repeat_blocks = [block for read, block in zip(reads, blocks) if not read.failed]
    if len(finished) > 1:
        for name in MEDIANS:
            values = [getattr(read, name) for read in finished if getattr(read, name) is not None]
            setattr(trial, name, statistics.median(values) if values else None)
        trial.ci95 = mean_interval(trial)
    return trial


def mean_interval(trial: Trial, pooled: Optional[Tuple[float, int]] = None) -> List[float]:
    """The 95 % interval of a trial's mean throughput over its repeats (with the pooled spread when given)."""
    mean, error = trial.estimate(pooled)
    return [math.exp(mean - Z_95 * error), math.exp(mean + Z_95 * error)]


def pool_intervals(trials: Sequence[Trial], pooled: Optional[Tuple[float, int]]) -> None:
    """Each repeated trial's interval drawn with the spread pooled over all of them, as they were
    compared (one trial's own two repeats give a spread of one degree of freedom: t = 12.7)."""
    if pooled is not None:
        for trial in trials:
            if trial.repeats:  # one finished repeat of several was compared with the pooled spread too
                trial.ci95 = mean_interval(trial, pooled)


def run_to_run_spread(trials: Sequence[Trial]) -> Optional[Tuple[float, int]]:
    """The spread of log throughput between runs of one setting within one block (a trial's
    repeats, run back to back), pooled over `trials` (the machine's run-to-run noise, which each
    trial shares), with its degrees of freedom; None with one run of each setting in each block."""
    groups = []
    for trial in trials:
        for block in sorted(set(trial.run_blocks)):
            groups.append([value for value, _ in trial.in_block(block).repeats])
    return pooled_log_spread(groups)


def drift_spread(trials: Sequence[Trial], within: Optional[Tuple[float, int]]) -> Optional[Tuple[float, int]]:
    """(standard deviation of log throughput, degrees of freedom) of the machine's drift from one
    block to the next, from the settings that ran in two or more blocks (an incumbent run beside
    later candidates): how far their block means scatter beyond what the spread `within` a block
    explains (one-way random effects, method of moments, floored at 0); None where no setting ran
    in two blocks."""
    noise = within[0] ** 2 if within else 0.0
    total, degrees = 0.0, 0
    for trial in trials:
        runs = [trial.in_block(block).repeats for block in sorted(set(trial.run_blocks))]
        groups = [np.log([value for value, _ in block_runs]) for block_runs in runs]
        if len(groups) < 2:
            continue
        counts = np.array([len(group) for group in groups], dtype=np.float64)
        means = np.array([group.mean() for group in groups])
        grand = float(np.sum(counts * means) / counts.sum())
        between = float(np.sum(counts * (means - grand) ** 2)) / (len(groups) - 1)
        per_block = (counts.sum() - float(np.sum(counts**2)) / counts.sum()) / (len(groups) - 1)
        total += (len(groups) - 1) * max(0.0, (between - noise) / per_block)
        degrees += len(groups) - 1
    return (math.sqrt(total / degrees), degrees) if degrees else None


def block_weights(trial: Trial) -> Dict[int, float]:
    """Block -> the share of the trial's finished runs in it (what each block's drift weighs in its mean)."""
    blocks = trial.run_blocks or [trial.number]  # a trial read without repeats: its one figure
    return {block: blocks.count(block) / len(blocks) for block in set(blocks)}


def against(
    candidate: Trial,
    incumbent: Trial,
    pooled: Optional[Tuple[float, int]] = None,
    drift: Optional[Tuple[float, int]] = None,
    level: float = CONFIDENCE,
) -> Comparison:
    """candidate / incumbent with the ratio's interval at `level` (bwopt.measure.uncertainty): the mean
    log throughput of every finished run of each, with each run's own interval and the run-to-run
    spread `pooled` where repeats measured it; and the machine's `drift` between blocks where it
    was measured (`drift_spread`): the two means draw on blocks in different shares, and each
    block's drift enters the difference by the gap between its two shares, scaled by Student's t
    for the drift's degrees of freedom. `level`: a sequential test's per-look level (tune's
    `extra_rounds`, bwopt.measure.uncertainty.sequential_level), 95 % otherwise."""
    own, other = candidate.estimate(pooled, level), incumbent.estimate(pooled, level)
    if drift is not None and drift[0] > 0:
        mine, theirs = block_weights(candidate), block_weights(incumbent)
        gaps = sum((mine.get(block, 0.0) - theirs.get(block, 0.0)) ** 2 for block in set(mine) | set(theirs))
        error = drift[0] * math.sqrt(gaps) * t_over_z(drift[1], level)
        other = (other[0], math.hypot(other[1], error))
    return compare(own, other, level)


def ratio_text(comparison: Comparison) -> str:
    low, high = comparison.ci95
    return f"×{comparison.ratio:.2f} ({comparison.interval_name} ×{low:.2f}–×{high:.2f})"


def figure_text(trial: Trial) -> str:
    if trial.failed:
        return "failed"
    interval = f" ({trial.ci95[0]:,.0f}–{trial.ci95[1]:,.0f})" if trial.ci95 else ""
    return f"{trial.throughput:,.0f}{interval}"


def table(trials: Sequence[Trial]) -> str:
    """The path as Markdown: one row per trial."""
    start = trials[0]
    rows = [TABLE_HEADER]
    for trial in trials:
        ratio = "" if trial.failed or start.failed else f"×{against(trial, start).ratio:.2f}"
        of_ceiling = f"{trial.of_ceiling:.2f} ({trial.ceiling_name})" if trial.of_ceiling else ""
        changed = ", ".join(f"`{key}={value}`" for key, value in trial.overrides.items()) if trial.number else ""
        change = f"{trial.change}: {changed}" if changed else trial.change
        kept = "yes" if trial.kept else f"no: {trial.note}" if trial.note else "no"
        runs = f"{len(trial.folders)} ({', '.join(folder.name for folder in trial.folders)})" if trial.folders else ""
        reason = trial.reason.replace("|", "/")
        cells = [str(trial.number), change, reason, figure_text(trial), ratio, of_ceiling, kept, runs]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def noise_sentence(repeats: int, pooled: Optional[Tuple[float, int]], drift: Optional[Tuple[float, int]] = None) -> str:
    """What the comparisons held: one run's noise, or the spread between a trial's repeats, and the
    machine's drift between trials where incumbents ran again beside later candidates (`drift_spread`)."""
    runs = "once" if repeats == 1 else f"{repeats} times"
    ran = f"each trial ran {runs}" + (
        ", and the incumbent once more beside each candidate" if drift else ", one after the other"
    )
    if drift:
        measured = (
            f"the machine's drift from one trial to the next, from how the incumbents' runs beside later "
            f"candidates scatter: {drift[0] * 100:.1f} % ({freedom(drift[1])})"
        )
    else:
        measured = ""
    if pooled is None:
        within = "each run's own interval (blocks of its timed steps), not the noise from one run to the next"
        if drift:
            return f"Noise: {ran}. Every comparison held {within}, and {measured}."
        if repeats > 1:
            return f"Noise: {ran}, but no trial finished two runs, so every comparison held {within}."
        return (
            f"Noise: {ran}, so every comparison held {within}; `hydra.sweeper.repeats=2` (the default) runs "
            "each trial twice and pools the spread between repeats into every comparison."
        )
    spread = (
        f"each run's interval and the spread between a trial's repeats, pooled over the trials: "
        f"{pooled[0] * 100:.1f} % of throughput (standard deviation, {freedom(pooled[1])})"
    )
    if drift:
        return f"Noise: {ran}. Every comparison held {spread}, and {measured}."
    return (
        f"Noise: {ran}. Every comparison held {spread}. Drift of the machine between one trial's runs and "
        "the next trial's is not in it (`hydra.sweeper.rerun_incumbent=true` measures it)."
    )


def rounds_sentence(extra_rounds: int, level: float, extended: Sequence[int]) -> str:
    """What the extra rounds did and the level every comparison with the incumbent took for them."""
    if not extra_rounds:
        return ""
    trials = f"trial{'s' if len(extended) > 1 else ''} {', '.join(map(str, extended))}"
    did = f" ({trials} did)" if extended else " (none needed one)"
    rounds = f"{extra_rounds} round{'' if extra_rounds == 1 else 's'}"
    return (
        f"Rounds: a candidate undecided but leaning its way could run up to {rounds} more{did}; every "
        f"comparison with the incumbent took {level * 100:.1f} % per look (Pocock's level for {extra_rounds + 1} "
        "looks), so a candidate's looks together call noise a difference no more often than one 95 % comparison."
    )


def freedom(degrees: int) -> str:
    return f"{degrees} degree{'' if degrees == 1 else 's'} of freedom"


def stage_table(picture: dict) -> str:
    """The probe's per-stage picture of the start as Markdown: what each stage costs per batch."""
    rows = [
        "| stage | kind | ms per batch (one core) | parallel | random | bytes per example out |",
        "|---|---|---|---|---|---|",
    ]
    for stage in picture["stages"]:
        cells = [
            stage["name"],
            stage["kind"],
            f"{stage['cost_per_batch_s'] * 1e3:,.2f}" + (" (waits)" if stage.get("io_bound") else ""),
            "yes" if stage.get("parallel") else "no",
            "yes" if stage.get("random") else "no",
            f"{stage.get('output_bytes_per_example', 0):,.0f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def closing_line(
    start: Trial,
    final: Trial,
    num_runs: int,
    elapsed_s: float,
    pooled: Optional[Tuple[float, int]] = None,
    drift: Optional[Tuple[float, int]] = None,
) -> str:
    """'tuned: ×3.1 over the start (95 % CI ×2.8–×3.4), 0.93 of the input ceiling, 4 runs, 2 min'."""
    minutes = f"{elapsed_s / 60:.0f} min" if elapsed_s >= 90 else f"{elapsed_s:.0f} s"
    if start.failed or final.failed:
        return f"tuned: nothing measured to compare, {num_runs} runs, {minutes}"
    if final is start:
        gain = "no change beat the start beyond the noise"
    else:
        comparison = against(final, start, pooled, drift)
        low, high = comparison.ci95
        gain = f"×{comparison.ratio:.1f} over the start (95 % CI ×{low:.1f}–×{high:.1f})"
    ceiling = f", {final.of_ceiling:.2f} of the {final.ceiling_name}" if final.of_ceiling else ""
    return f"tuned: {gain}{ceiling}, {num_runs} runs, {minutes}"


def tuned_overrides(base: Sequence[str], overrides: Dict[str, str]) -> List[str]:
    """The workload's overrides (without tune's own) followed by what tune kept."""
    kept_keys = set(overrides)
    workload = [item for item in base if item.split("=", 1)[0].lstrip("+~") not in kept_keys]
    return [*workload, *(f"{key}={value}" for key, value in overrides.items())]


def write_tuned(path: Path, base: Sequence[str], overrides: Dict[str, str]) -> Path:
    """tuned.yaml: one override per line, no comments, so `python -m bwopt $(cat tuned.yaml)` runs it
    (and YAML reads it as one string of them)."""
    path.write_text("\n".join(tuned_overrides(base, overrides)) + "\n")
    return path


def cores_used(trial: Trial) -> Optional[float]:
    return trial.cpu_s / trial.wall_s if trial.wall_s > 0 and not math.isnan(trial.cpu_s) else None
