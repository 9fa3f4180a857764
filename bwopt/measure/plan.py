"""Which steps of the timed loop the figures come from (`StepPlan`), and how many more to time
for a window of `measure.min_timed_s` (`extra_steps_needed`)."""

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class StepPlan:
    """Which steps of a loop of `epochs` x `steps_per_epoch` steps the figures are computed from.

    Attributes:
        epochs, steps_per_epoch: the loop's shape.
        warmup_steps: the first steps of the loop, left out (tracing, autotuning, cache fill).
        epoch_warmup_steps: the first steps of every epoch after the first, left out (the
            pipeline refilled its buffers during validation, so they get their batches for free).
        profiled: steps a profiler traced, left out (tracing slows them).
        steps_per_execution: training steps per loop step (`train.steps_per_execution`); every
            other attribute counts loop steps.
        first_epoch: the epoch the loop starts at (a resumed run: the earlier epochs ran before).
        extra_steps: steps timed after the last epoch, to fill `measure.min_timed_s`; the first
            `epoch_warmup_steps` of them are left out, as at an epoch's start.
    """

    epochs: int
    steps_per_epoch: int
    warmup_steps: int
    epoch_warmup_steps: int = 0
    profiled: Tuple[int, ...] = ()
    steps_per_execution: int = 1
    first_epoch: int = 0
    extra_steps: int = 0

    @property
    def num_steps(self) -> int:
        """The epochs' steps (extra steps not counted)."""
        return self.epochs * self.steps_per_epoch

    def excluded(self) -> set:
        """Steps after the initial warm-up that are left out: later epochs' first steps, the extra
        steps' first ones, profiled steps."""
        first_steps = range(min(self.epoch_warmup_steps, self.steps_per_epoch))
        epoch_starts = {epoch * self.steps_per_epoch + step for epoch in range(1, self.epochs) for step in first_steps}
        extra_start = range(self.num_steps, self.num_steps + min(self.epoch_warmup_steps, self.extra_steps))
        return epoch_starts | set(extra_start) | set(self.profiled)

    def timed(self, num_steps_run: Optional[int] = None) -> List[int]:
        """Indices of the timed steps among the first `num_steps_run` (all steps when None)."""
        total = self.num_steps + self.extra_steps
        end = total if num_steps_run is None else min(num_steps_run, total)
        excluded = self.excluded()
        return [index for index in range(self.warmup_steps, end) if index not in excluded]


def extra_steps_needed(timer, plan: StepPlan, min_timed_s: float, max_steps: int = 1_000_000) -> int:
    """Loop steps to time after the epochs (`timer`: the run's StepTimer) so that the timed window
    lasts `min_timed_s` (0: it does already), from the mean timed step so far, with 5 % to spare;
    the first ones added also cover the extra steps' warm-up. At most `max_steps`."""
    kept = plan.timed(timer.num_steps)
    if not kept:
        return 0
    seconds = float(sum(timer.input_wait_s[index] + timer.compute_s[index] for index in kept))
    if seconds >= min_timed_s:
        return 0
    needed = math.ceil((min_timed_s - seconds) / (seconds / len(kept)) * 1.05)
    if plan.extra_steps == 0:
        needed += plan.epoch_warmup_steps
    return min(max(needed, 1), max_steps)
