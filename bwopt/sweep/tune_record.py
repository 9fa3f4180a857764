"""What `tune` measured: each trial as read from its job folder and the comparisons with their
noise (in words, tables and tuned.yaml: bwopt.sweep.tune_text; the plot of the path:
bwopt.sweep.tune_plot). No TensorFlow.

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
    interval_error,
    log_estimate,
    pooled_log_spread,
    satterthwaite,
    t_over_z,
)
from bwopt.sweep.results import read_job, read_summary


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
            candidate's repeats and the incumbent's runs among them, a few minutes that share the
            machine's state; `drift_spread` measures how blocks differ). Without extra rounds a
            trial's own round is its number.
        repeat_blocks: the block of each finished run (beside `repeats`).
        slow_time_fractions: the share of each finished run's timed window in slow episodes
            (bwopt.measure.episodes; None where its window was too short to tell).
        compute_ceiling, input_ceiling, cores_ceiling: examples/s (None when not measured; the
            cores ceiling is what the step and the pipeline sustain together on the cores they share).
        cores_busy, cores_available: the cores its training kept busy, measured over its timed
            steps, and the cores it had (None when not measured).
        step_cores, compute_cpu_s_per_example: the whole cores the step holds while it runs
            (bwopt.measure.ceilings.step_cores) and its CPU time per example, measured with the
            ceilings (None when not).
        step_partition: part -> share of step time.
        val_accuracy: the final validation accuracy.
        wall_s, cpu_s: the job's processes (every repeat), start to end.
        kept: it beat the incumbent beyond the noise (the start is kept).
        against_incumbent: the comparison that decided, when there was one.
        note: why it was reverted, or other words for the table.
        undecided: its last comparison with the incumbent found no difference either way, and it
            learned as well as the start (`tune_plan.together` may run it again with others).
        predicted_gain: what the cost model expected the change to multiply the throughput by
            (None for the start).
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
    step_cores: Optional[int] = None
    compute_cpu_s_per_example: Optional[float] = None
    step_partition: Dict[str, float] = field(default_factory=dict)
    val_accuracy: Optional[float] = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    kept: bool = False
    against_incumbent: Optional[Comparison] = None
    note: str = ""
    undecided: bool = False
    predicted_gain: Optional[float] = None
    repeats: List[Tuple[float, Optional[List[float]]]] = field(default_factory=list)
    folders: List[Path] = field(default_factory=list)
    blocks: List[int] = field(default_factory=list)
    repeat_blocks: List[int] = field(default_factory=list)
    slow_time_fractions: List[Optional[float]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.throughput is None

    @property
    def cores_held(self) -> Optional[float]:
        """The cores its training holds: those it kept busy, plus those a step that spans several
        holds but leaves idle between its ops (its whole cores for its wall time less its CPU time,
        per example, times the throughput); the cores busy where the step holds one or was not
        measured."""
        measured = (self.cores_busy, self.compute_ceiling, self.compute_cpu_s_per_example, self.throughput)
        if None in measured or not (self.step_cores and self.step_cores > 1 and self.compute_ceiling):
            return self.cores_busy
        idle = max(0.0, self.step_cores / self.compute_ceiling - self.compute_cpu_s_per_example)
        return self.cores_busy + idle * self.throughput

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
    trial.step_cores = measurements.get("step_cores")
    trial.compute_cpu_s_per_example = measurements.get("compute_cpu_s_per_example")
    trial.step_partition = figures.get("step_partition") or {}
    trial.slow_time_fractions = [figures.get("slow_time_fraction")]
    trial.val_accuracy = job.val_accuracy
    return trial


MEDIANS = (
    "throughput",
    "compute_ceiling",
    "input_ceiling",
    "cores_ceiling",
    "cores_busy",
    "compute_cpu_s_per_example",
    "val_accuracy",
)


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
    trial.slow_time_fractions = [read.slow_time_fractions[0] for read in finished]
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
    """Each repeated trial's interval drawn with the spread it was compared with: its setting's
    (`setting_spread`), from the one pooled over all of them (one trial's own two repeats alone
    give a spread of one degree of freedom: t = 12.7)."""
    if pooled is not None:
        for trial in trials:
            if trial.repeats:  # one finished repeat of several was compared with the pooled spread too
                trial.ci95 = mean_interval(trial, setting_spread(trial, pooled))


def run_to_run_spread(trials: Sequence[Trial]) -> Optional[Tuple[float, int]]:
    """The spread of log throughput between runs of one setting within one block (a trial's
    repeats, and the incumbent's runs beside a candidate, each back to back), pooled over `trials`
    (the machine's run-to-run noise, which each trial shares), with its degrees of freedom; None
    with one run of each setting in each block."""
    return pooled_log_spread([runs for trial in trials for runs in block_runs(trial)])


def block_runs(trial: Trial) -> List[List[float]]:
    """The throughputs of `trial`'s finished runs, one list per block, blocks in order."""
    return [[value for value, _ in trial.in_block(block).repeats] for block in sorted(set(trial.run_blocks))]


# How many degrees of freedom the pooled spread counts for in a setting's own (`setting_spread`).
PRIOR_DEGREES = 2


def setting_spread(trial: Trial, pooled: Optional[Tuple[float, int]]) -> Optional[Tuple[float, int]]:
    """The run-to-run spread a comparison takes for `trial`'s runs, with its degrees of freedom: its
    own scatter within each block moderated toward the `pooled` one (which counts as
    `PRIOR_DEGREES` runs' worth), or the pooled one where that is larger, never less; as sure as
    its own runs and those prior degrees make it, never as sure as the whole pool, which other
    settings' runs fill. Settings need not scatter alike (one vectorised map call per batch
    scattered 16 % from run to run where two map calls scattered 7-9 %): a noisy one is judged by
    its own noise, with the uncertainty of few runs, and a quiet one by the pool's, with that same
    uncertainty, since two of its runs that happen to agree do not show it quiet. The pooled
    spread itself where the trial has no two runs in one block."""
    if pooled is None:
        return None
    own = pooled_log_spread(block_runs(trial))
    if own is None:
        return pooled
    squares, degrees = own[0] ** 2 * own[1], own[1]
    moderated = (squares + PRIOR_DEGREES * pooled[0] ** 2) / (degrees + PRIOR_DEGREES)
    return (math.sqrt(moderated) if moderated > pooled[0] ** 2 else pooled[0]), min(degrees + PRIOR_DEGREES, pooled[1])


def drift_spread(trials: Sequence[Trial], pooled: Optional[Tuple[float, int]]) -> Optional[Tuple[float, int]]:
    """(standard deviation of log throughput, degrees of freedom) of the machine's drift from one
    block to the next, from the settings that ran in two or more blocks (an incumbent run beside
    later candidates): how far their block means scatter beyond what each one's own spread within
    a block explains (`setting_spread`; one-way random effects, method of moments, floored at 0),
    so a setting that scatters more than the others does not read as a drifting machine; None
    where no setting ran in two blocks."""
    total, degrees = 0.0, 0
    for trial in trials:
        groups = [np.log(runs) for runs in block_runs(trial)]
        if len(groups) < 2:
            continue
        own = setting_spread(trial, pooled)
        noise = own[0] ** 2 if own else 0.0
        counts = np.array([len(group) for group in groups], dtype=np.float64)
        means = np.array([group.mean() for group in groups])
        grand = float(np.sum(counts * means) / counts.sum())
        between = float(np.sum(counts * (means - grand) ** 2)) / (len(groups) - 1)
        per_block = (counts.sum() - float(np.sum(counts**2)) / counts.sum()) / (len(groups) - 1)
        total += (len(groups) - 1) * max(0.0, (between - noise) / per_block)
        degrees += len(groups) - 1
    return (math.sqrt(total / degrees), degrees) if degrees else None


def against(
    candidate: Trial,
    incumbent: Trial,
    pooled: Optional[Tuple[float, int]] = None,
    drift: Optional[Tuple[float, int]] = None,
    level: float = CONFIDENCE,
) -> Comparison:
    """candidate / incumbent with the ratio's interval at `level` (bwopt.measure.uncertainty).

    Where repeats measured the run-to-run spread (`pooled`), each side's runs scatter by their own
    setting's spread (`setting_spread`) and the machine's drift between blocks (`drift_spread`)
    where measured: `block_contrast`. Without a spread: each run's own interval, the two means.
    `level`: a sequential test's per-look level (tune's `extra_rounds`,
    bwopt.measure.uncertainty.sequential_level), 95 % otherwise."""
    if pooled is None or pooled[0] <= 0:
        return compare(candidate.estimate(None, level), incumbent.estimate(None, level), level)
    drifting = drift if drift is not None and drift[0] > 0 else None
    return compare(block_contrast(candidate, incumbent, pooled, drifting, level), (0.0, 0.0), level)


def block_contrast(
    candidate: Trial,
    incumbent: Trial,
    pooled: Tuple[float, int],
    drift: Optional[Tuple[float, int]],
    level: float,
) -> Tuple[float, float]:
    """(log of candidate / incumbent, its standard error widened for `level`): generalised least
    squares under one-way random block effects. Each run's log throughput is its setting's level,
    plus its block's drift (standard deviation `drift`, shared by the block's runs; None: no
    drift), plus its own noise (the larger of its setting's spread within blocks, `setting_spread`
    from the `pooled` one, and its run's own interval). The weights that minimise the
    difference's variance lean on the runs of both in the same blocks, where the drift cancels, as
    far as the drift outweighs the spread, and on every run of each as far as it does not; with no
    drift they are the two means.

    The spreads are estimates: the difference's variance is the sum of what each contributes
    through those weights, and its degrees of freedom Satterthwaite's for that sum (Welch's test
    where there is no drift), rounded down as a table of t is read; the error is scaled by
    Student's t over the normal quantile at that many, so a noisy side's few runs widen the
    interval as far as its noise weighs in the difference. Both sides at the pool's spread are one
    estimate, one part (as sure as the less sure side: `setting_spread`), and the two sides'
    spreads together never count more degrees of freedom than the pool that holds their runs."""
    spreads = setting_spread(candidate, pooled), setting_spread(incumbent, pooled)
    logs, sides, blocks, noise = [], [], [], []
    for side, trial in enumerate((candidate, incumbent)):
        runs = trial.repeats or [(trial.throughput, trial.ci95)]
        for (value, bounds), block in zip(runs, trial.run_blocks if trial.repeats else [trial.number]):
            logs.append(math.log(value))
            sides.append(side)
            blocks.append(block)
            noise.append(max(spreads[side][0], interval_error(bounds) or 0.0))
    variances, sides = np.square(noise), np.asarray(sides)
    same_block = np.equal.outer(blocks, blocks).astype(np.float64)
    covariance = np.diag(variances) + (drift[0] ** 2 * same_block if drift else 0.0)
    design = np.eye(2)[sides]
    weighted = np.linalg.solve(covariance, design)
    levels_covariance = np.linalg.inv(design.T @ weighted)
    weights = np.array([1.0, -1.0]) @ levels_covariance @ weighted.T  # the difference's weight on each run
    parts = [
        (float(np.sum(weights[sides == side] ** 2 * variances[sides == side])), spreads[side][1]) for side in (0, 1)
    ]
    if spreads[0][0] == spreads[1][0] == pooled[0]:
        parts = [(parts[0][0] + parts[1][0], min(spreads[0][1], spreads[1][1]))]
    within = (sum(part for part, _ in parts), min(pooled[1], satterthwaite(parts)))
    drifting = [(drift[0] ** 2 * float(weights @ same_block @ weights), drift[1])] if drift else []
    variance, degrees = within[0] + sum(part for part, _ in drifting), satterthwaite([within, *drifting])
    levels = levels_covariance @ (weighted.T @ np.asarray(logs))
    return float(levels[0] - levels[1]), math.sqrt(variance) * t_over_z(max(1, math.floor(degrees)), level)


def cores_used(trial: Trial) -> Optional[float]:
    return trial.cpu_s / trial.wall_s if trial.wall_s > 0 and not math.isnan(trial.cpu_s) else None
