"""Figures of the timed loop.

A training step is timed in two parts on the host's monotonic clock (`time.perf_counter`):

- input wait: the time blocked in `next(iterator)` on the distributed dataset, i.e. until the
  batch for every replica is available;
- compute: from dispatching the step to the moment its results are back on the host (the loop
  reads them, so the step has finished on every replica).

Step time is their sum. Steps run back to back, so the sum of the step times of the timed steps
is the wall time they took. Which steps are timed is a `StepPlan`: excluded are the first
`warmup_steps` steps (tracing, autotuning, cache fill); the first `epoch_warmup_steps` steps of
every later epoch, because the input pipeline keeps filling its buffers during the validation pass
between epochs, so those steps would get their batches for free; and steps a profiler traced.
Validation itself is not part of any step.
"""

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from bwopt.loop import Hook, StepRecord

# TensorFlow Profiler's input-pipeline analyzer thresholds on the input-wait fraction.
MODERATELY_INPUT_BOUND = 0.05
HIGHLY_INPUT_BOUND = 0.20

# Scales the median absolute deviation to the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826


@dataclass
class StepTimer(Hook):
    """Per-step input-wait and compute times, in seconds, in step order: a hook of the timed loop."""

    input_wait_s: List[float] = field(default_factory=list)
    compute_s: List[float] = field(default_factory=list)

    def record(self, input_wait_s: float, compute_s: float) -> None:
        self.input_wait_s.append(input_wait_s)
        self.compute_s.append(compute_s)

    def on_step_end(self, step: int, record: StepRecord) -> None:
        self.record(record.input_wait_s, record.compute_s)

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
        input_wait_fraction: total input wait / timed_wall_s.
        input_bound_verdict: the TF Profiler's reading of input_wait_fraction.
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

    def metrics(self) -> dict:
        """The numeric figures, as MLflow metrics."""
        return {key: value for key, value in asdict(self).items() if not isinstance(value, str)}


def input_bound_verdict(input_wait_fraction: float) -> str:
    """'not input-bound' below 5 %, 'moderately input-bound' below 20 %, else 'highly input-bound'."""
    if input_wait_fraction < MODERATELY_INPUT_BOUND:
        return "not input-bound"
    if input_wait_fraction < HIGHLY_INPUT_BOUND:
        return "moderately input-bound"
    return "highly input-bound"


def jitter(values: Sequence[float]) -> float:
    values = np.asarray(values, dtype=np.float64)
    return float(MAD_TO_SIGMA * np.median(np.abs(values - np.median(values))))


@dataclass(frozen=True)
class StepPlan:
    """Which steps of a loop of `epochs` x `steps_per_epoch` steps the figures are computed from.

    Attributes:
        epochs, steps_per_epoch: the loop's shape.
        warmup_steps: the first steps of the loop, left out (tracing, autotuning, cache fill).
        epoch_warmup_steps: the first steps of every epoch after the first, left out (the
            pipeline refilled its buffers during validation, so they get their batches for free).
        profiled: steps a profiler traced, left out (tracing slows them).
    """

    epochs: int
    steps_per_epoch: int
    warmup_steps: int
    epoch_warmup_steps: int = 0
    profiled: Tuple[int, ...] = ()

    @property
    def num_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def excluded(self) -> set:
        """Steps after the initial warm-up that are left out: later epochs' first steps, profiled steps."""
        first_steps = range(min(self.epoch_warmup_steps, self.steps_per_epoch))
        epoch_starts = {epoch * self.steps_per_epoch + step for epoch in range(1, self.epochs) for step in first_steps}
        return epoch_starts | set(self.profiled)

    def timed(self, num_steps_run: Optional[int] = None) -> List[int]:
        """Indices of the timed steps among the first `num_steps_run` (all steps when None)."""
        end = self.num_steps if num_steps_run is None else min(num_steps_run, self.num_steps)
        excluded = self.excluded()
        return [index for index in range(self.warmup_steps, end) if index not in excluded]


def timing_figures(timer: StepTimer, plan: StepPlan, examples_per_step: int, bytes_per_step: int) -> TimingFigures:
    """Summarise the steps of `timer` that `plan` times (those that ran, when the loop stopped early).

    Raises:
        ValueError: when none of the steps that ran is timed.
    """
    kept = plan.timed(timer.num_steps)
    input_wait = np.asarray(timer.input_wait_s, dtype=np.float64)[kept]
    step = input_wait + np.asarray(timer.compute_s, dtype=np.float64)[kept]
    if len(step) == 0:
        raise ValueError(f"no step was timed: {timer.num_steps} steps ran, the first {plan.warmup_steps} are warm-up")
    wall_s = float(step.sum())
    fraction = float(input_wait.sum() / wall_s)
    p50, p90, p99 = np.percentile(step, [50, 90, 99])
    return TimingFigures(
        num_timed_steps=len(step),
        timed_wall_s=wall_s,
        throughput_examples_per_s=len(step) * examples_per_step / wall_s,
        throughput_bytes_per_s=len(step) * bytes_per_step / wall_s,
        step_time_p50_s=float(p50),
        step_time_p90_s=float(p90),
        step_time_p99_s=float(p99),
        step_time_jitter_s=jitter(step),
        input_wait_fraction=fraction,
        input_bound_verdict=input_bound_verdict(fraction),
    )
