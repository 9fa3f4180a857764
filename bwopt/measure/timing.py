"""Figures of the timed loop.

A training step is timed in two parts on the host's monotonic clock (`time.perf_counter`):

- input wait: the time blocked in `next(iterator)` on the distributed dataset, i.e. until the
  batch for every replica is available;
- compute: from dispatching the step to the moment its results are back on the host (the loop
  reads them, so the step has finished on every replica).

Step time is their sum. Steps run back to back, so the sum of the step times of the timed steps
is the wall time they took.

The input wait holds two different costs, told apart with references measured in the same run
(`bwopt.measure.overhead`):

- input stall: the part of a step's input wait beyond the fixed cost of fetching a batch that
  is ready (`fetch_overhead_s`, `next()` on the same distributed iterator type over one cached
  batch), i.e. the time the step waited for a pipeline that had not produced its batch yet;
  per step `max(0, input_wait - fetch_overhead_s)`. The TF Profiler's thresholds apply to it.
- host overhead: what the host pays per step whatever the pipeline does: that fetch cost
  (`min(input_wait, fetch_overhead_s)`) plus dispatching the step and reading its results
  (`dispatch_overhead_s`, a distributed step that computes nothing, on the same batch, read on
  the host; at most the step's compute time). Its cure is fewer host round trips per training
  step: `train.steps_per_execution`.

With `train.steps_per_execution: N > 1` one loop step is one execution of N training steps in
one `tf.function` call, which takes the batches from the distributed iterator inside the graph:
the host calls `next()` on nothing, so input wait is zero and "compute" is the whole execution
(N fetches in the graph, N steps, one dispatch, one read of the results). The stall cannot be
timed inside the graph; it is estimated over all timed executions as
`max(0, sum(execution) - num_executions x ready_execution_s)`, where `ready_execution_s` is the
median of block means of the same N-step function over an iterator of one cached batch (batches
always ready), and the host overhead is one `dispatch_overhead_s` per execution. The estimate
is as good as that reference: machine noise between the two measurements moves it by a few %.
Step-time figures are per training step (execution / N). Which steps are timed is a `StepPlan`: excluded are the first
`warmup_steps` steps (tracing, autotuning, cache fill); the first `epoch_warmup_steps` steps of
every later epoch, because the input pipeline keeps filling its buffers during the validation pass
between epochs, so those steps would get their batches for free; and steps a profiler traced.
Validation itself is not part of any step.

Around each step the loop also reads the process's CPU time (every thread's: the step's ops and
the input pipeline's, which runs ahead in the background). Over the timed steps, CPU seconds / wall
seconds is `cores_busy`: how many cores the run kept busy on average, measured, not estimated
(compare the cores ceiling, `bwopt.measure.ceilings`); CPU seconds / examples is
`cpu_s_per_example`. Only this process's CPU is counted: with the tf.data service or a cluster,
the work done elsewhere is not.
"""

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from bwopt.loop import Hook, StepRecord
from bwopt.measure.episodes import slow_episodes, windows
from bwopt.measure.plan import StepPlan
from bwopt.measure.references import HostReferences
from bwopt.measure.uncertainty import partition_shares, step_uncertainty, widened, window_means_interval
from bwopt.measure.verdicts import input_bound_verdict, interval_verdict

# Scales the median absolute deviation to the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826


@dataclass
class StepTimer(Hook):
    """Per-step input-wait and compute times and the process's CPU time over the step, in seconds,
    in step order (CPU time NaN where it was not read: a step run by another process): a hook of
    the timed loop."""

    follows_extra_steps = True
    input_wait_s: List[float] = field(default_factory=list)
    compute_s: List[float] = field(default_factory=list)
    cpu_s: List[float] = field(default_factory=list)

    def record(self, input_wait_s: float, compute_s: float, cpu_s: Optional[float] = None) -> None:
        self.input_wait_s.append(input_wait_s)
        self.compute_s.append(compute_s)
        self.cpu_s.append(math.nan if cpu_s is None else cpu_s)

    def on_step_end(self, step: int, record: StepRecord) -> None:
        self.record(record.input_wait_s, record.compute_s, record.cpu_s)

    @property
    def num_steps(self) -> int:
        return len(self.compute_s)


@dataclass
class TimingFigures:
    """Figures over the timed (post warm-up) steps.

    Attributes:
        num_timed_steps: steps measured, warm-up excluded.
        timed_wall_s: wall time of the timed steps (sum of their step times).
        throughput_examples_per_s: examples consumed by the timed steps / timed_wall_s.
        throughput_bytes_per_s: host bytes of those examples (features as transferred, plus
            labels) / timed_wall_s.
        step_time_p50_s, step_time_p90_s, step_time_p99_s: percentiles of the step time
            (linear interpolation between order statistics).
        step_time_jitter_s: 1.4826 x the median absolute deviation of the step time, a spread
            that a few outliers (a GC pause, an epoch boundary) do not inflate.
        input_wait_fraction: total input wait / timed_wall_s (stall and fetch cost together).
        input_bound_verdict: the TF Profiler's reading of input_stall_fraction (of
            input_wait_fraction when no reference was measured).
        steps_per_execution: training steps per loop step (`train.steps_per_execution`).
        fetch_overhead_s: median `next()` time on a ready batch (None: not measured, or N > 1).
        dispatch_overhead_s: median time of a step that computes nothing, dispatch to host read.
        ready_execution_s: N > 1 only: median time of one execution on batches always ready.
        input_stall_fraction: total input stall / timed_wall_s (None: no reference measured).
        host_overhead_fraction: total host overhead / timed_wall_s (None: no reference measured).
        verdict: what limits the run: "highly input-bound" or "moderately input-bound" (the
            Profiler's thresholds on the stall), "host-overhead-bound" (host overhead >= 20 %
            of step time), both at once `BOTH_BOUND`, else "compute-bound"; see `bottleneck_verdict`.
        cores_busy: the process's CPU seconds over the timed steps / their wall seconds (None
            when a timed step's CPU time was not read); cores_busy_ci95 its interval.
        cpu_s_per_example: the process's CPU seconds over the timed steps / their examples.
        rate_windows, rate_window_spread, slow_time_fraction, slow_episodes, longest_slow_episode_s:
            how even the rate was over the timed window: the windows of at least 0.5 s of steps it
            was cut into, their rates' spread, and the stretches below 0.6 of their median rate
            (`bwopt.measure.episodes`; None with fewer than 4 windows).
    """

    num_timed_steps: int
    timed_wall_s: float
    throughput_examples_per_s: float
    throughput_bytes_per_s: float
    step_time_p50_s: float
    step_time_p90_s: float
    step_time_p99_s: float
    step_time_jitter_s: float
    input_wait_fraction: float
    input_bound_verdict: str
    steps_per_execution: int = 1
    fetch_overhead_s: Optional[float] = None
    dispatch_overhead_s: Optional[float] = None
    ready_execution_s: Optional[float] = None
    input_stall_fraction: Optional[float] = None
    host_overhead_fraction: Optional[float] = None
    verdict: str = ""
    throughput_examples_per_s_ci95: Optional[List[float]] = None
    input_wait_fraction_ci95: Optional[List[float]] = None
    input_stall_fraction_ci95: Optional[List[float]] = None
    host_overhead_fraction_ci95: Optional[List[float]] = None
    step_partition: Dict[str, float] = field(default_factory=dict)
    step_partition_ci95: Dict[str, List[float]] = field(default_factory=dict)
    cores_busy: Optional[float] = None
    cores_busy_ci95: Optional[List[float]] = None
    cpu_s_per_example: Optional[float] = None
    rate_windows: Optional[int] = None
    rate_window_spread: Optional[float] = None
    slow_time_fraction: Optional[float] = None
    slow_episodes: Optional[int] = None
    longest_slow_episode_s: Optional[float] = None

    def metrics(self) -> dict:
        """The numeric figures that were measured, as MLflow metrics: an interval [low, high] as
        `<name>_ci95_low` and `<name>_ci95_high`, the partition as `step_partition/<part>_fraction`."""
        metrics = {}
        for key, value in asdict(self).items():
            if isinstance(value, list):
                metrics.update(
                    {f"{key[: -len('_ci95')]}_ci95_low": value[0], f"{key[: -len('_ci95')]}_ci95_high": value[1]}
                )
            elif isinstance(value, dict):
                continue
            elif value is not None and not isinstance(value, str):
                metrics[key] = value
        for part, share in self.step_partition.items():
            metrics[f"step_partition/{part}_fraction"] = share
            low, high = self.step_partition_ci95.get(part, (None, None))
            if low is not None:
                metrics[f"step_partition/{part}_fraction_ci95_low"] = low
                metrics[f"step_partition/{part}_fraction_ci95_high"] = high
        return metrics


def split_input_wait(
    input_wait_s: np.ndarray, compute_s: np.ndarray, references: HostReferences
) -> Tuple[np.ndarray, np.ndarray]:
    """(input stall, host overhead) per loop step, in seconds, as the module docstring defines them."""
    dispatch = np.minimum(compute_s, references.dispatch_overhead_s)
    if references.ready_execution_s is not None:  # N steps per call: no next() on the host
        # In aggregate, so that noise around the reference cancels instead of counting as stall.
        excess = float(np.sum(input_wait_s + compute_s) - len(compute_s) * references.ready_execution_s)
        stall = np.full(len(compute_s), max(0.0, excess) / max(len(compute_s), 1))
        return stall, input_wait_s + dispatch
    fetch = references.fetch_overhead_s or 0.0
    return np.maximum(0.0, input_wait_s - fetch), np.minimum(input_wait_s, fetch) + dispatch


def jitter(values: Sequence[float]) -> float:
    values = np.asarray(values, dtype=np.float64)
    return float(MAD_TO_SIGMA * np.median(np.abs(values - np.median(values))))


def timing_figures(
    timer: StepTimer,
    plan: StepPlan,
    examples_per_step: int,
    bytes_per_step: int,
    references: Optional[HostReferences] = None,
) -> TimingFigures:
    """Summarise the steps of `timer` that `plan` times (those that ran, when the loop stopped early).

    `examples_per_step` and `bytes_per_step` are per training step; each loop step runs
    `plan.steps_per_execution` of them. Without `references` the wait is not split: the stall and host
    overhead fractions are None and the verdicts read the whole input wait.

    Raises:
        ValueError: when none of the steps that ran is timed.
    """
    kept = plan.timed(timer.num_steps)
    input_wait = np.asarray(timer.input_wait_s, dtype=np.float64)[kept]
    compute = np.asarray(timer.compute_s, dtype=np.float64)[kept]
    step = input_wait + compute
    if len(step) == 0:
        raise ValueError(f"no step was timed: {timer.num_steps} steps ran, the first {plan.warmup_steps} are warm-up")
    wall_s = float(step.sum())
    fraction = float(input_wait.sum() / wall_s)
    steps_per_execution = plan.steps_per_execution
    parts = step_parts(input_wait, compute, references)
    series = {"input_wait": input_wait}
    cpu = np.asarray(timer.cpu_s, dtype=np.float64)[kept] if len(timer.cpu_s) == timer.num_steps else None
    if cpu is not None and not np.isnan(cpu).any():
        series["cpu"] = cpu  # its share of step time is the cores kept busy
    uncertain = step_uncertainty(parts, examples_per_step * steps_per_execution, series)
    if references is not None and references.ranges:
        # The references' own noise moves every step's split at once, which resampling the steps
        # cannot show: each part's interval also holds its share with the references at the
        # ends of their blocks' ranges.
        ends = [partition_shares(step_parts(input_wait, compute, references.at(side))) for side in (0, 1)]
        for name, bounds in uncertain.partition_ci95.items():
            uncertain.partition_ci95[name] = widened(bounds, [end[name] for end in ends])
    # What drifts over seconds moves the shares by more than resampled steps show: each share's
    # interval also holds the batch-means one of its half-second windows.
    cuts = windows(step)
    shares = [(uncertain.partition_ci95, name, part_s, uncertain.partition[name]) for name, part_s in parts.items()]
    for intervals, name, part_s, estimate in [*shares, (uncertain.series_ci95, "input_wait", input_wait, fraction)]:
        batch_means = window_means_interval(part_s, step, cuts, estimate)
        if batch_means is not None:
            low, high = widened(intervals[name], batch_means)
            intervals[name] = [max(low, 0.0), min(high, 1.0)]
    stall_fraction = host_fraction = stall_ci = host_ci = None
    if references is not None:
        stall_fraction, host_fraction = uncertain.partition["input_stall"], uncertain.partition["host_overhead"]
        stall_ci, host_ci = uncertain.partition_ci95["input_stall"], uncertain.partition_ci95["host_overhead"]
    per_training_step = step / steps_per_execution
    p50, p90, p99 = np.percentile(per_training_step, [50, 90, 99])
    num_training_steps = len(step) * steps_per_execution
    wait_ci = uncertain.series_ci95["input_wait"]
    cpu_s = float(series["cpu"].sum()) if "cpu" in series else None
    episodes = slow_episodes(step)
    return TimingFigures(
        num_timed_steps=num_training_steps,
        timed_wall_s=wall_s,
        throughput_examples_per_s=num_training_steps * examples_per_step / wall_s,
        throughput_bytes_per_s=num_training_steps * bytes_per_step / wall_s,
        step_time_p50_s=float(p50),
        step_time_p90_s=float(p90),
        step_time_p99_s=float(p99),
        step_time_jitter_s=jitter(per_training_step),
        input_wait_fraction=fraction,
        input_bound_verdict=input_bound_verdict(fraction if stall_fraction is None else stall_fraction),
        steps_per_execution=steps_per_execution,
        fetch_overhead_s=references.fetch_overhead_s if references else None,
        dispatch_overhead_s=references.dispatch_overhead_s if references else None,
        ready_execution_s=references.ready_execution_s if references else None,
        input_stall_fraction=stall_fraction,
        host_overhead_fraction=host_fraction,
        verdict=interval_verdict(stall_ci or wait_ci, host_ci),
        throughput_examples_per_s_ci95=uncertain.throughput_ci95,
        input_wait_fraction_ci95=wait_ci,
        input_stall_fraction_ci95=stall_ci,
        host_overhead_fraction_ci95=host_ci,
        step_partition=uncertain.partition,
        step_partition_ci95=uncertain.partition_ci95,
        cores_busy=None if cpu_s is None else cpu_s / wall_s,
        cores_busy_ci95=uncertain.series_ci95.get("cpu"),
        cpu_s_per_example=None if cpu_s is None else cpu_s / (num_training_steps * examples_per_step),
        **(asdict(episodes) if episodes else {}),
    )


def step_parts(
    input_wait: np.ndarray, compute: np.ndarray, references: Optional[HostReferences]
) -> Dict[str, np.ndarray]:
    """Seconds of each part of the step (`bwopt.measure.uncertainty.PARTS`) per loop step; they sum to the step time.

    compute: the step's own work (its compute time less the dispatch and host read); input stall
    and host overhead as `split_input_wait` defines them; other: the input wait when no reference
    split it. With N steps per execution the stall is each execution's excess over
    `ready_execution_s` (negative for executions faster than the reference: only the sum is
    clipped at 0, in `step_uncertainty`).
    """
    zeros = np.zeros(len(compute))
    if references is None:
        return {"compute": compute, "input_stall": zeros, "host_overhead": zeros, "other": input_wait}
    dispatch = np.minimum(compute, references.dispatch_overhead_s)
    if references.ready_execution_s is not None:
        stall = input_wait + compute - references.ready_execution_s
        return {
            "compute": references.ready_execution_s - dispatch,
            "input_stall": stall,
            "host_overhead": dispatch,
            "other": zeros,
        }
    stall, host = split_input_wait(input_wait, compute, references)
    return {"compute": compute - dispatch, "input_stall": stall, "host_overhead": host, "other": zeros}
