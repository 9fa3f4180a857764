"""The one timed loop, with hooks: training, `mode=input`, the ceilings and the benchmarks run it.

Each step is timed in two parts on the host's monotonic clock (`time.perf_counter`): the input
wait, blocked in `next(iterator)`, and the compute, from calling `step(batch)` until it returns.
`step` must not return before the work it dispatched has finished (read its results on the host),
so that the compute time is the step's. Everything else a run does around its steps (the step
timer, the progress bar, the profiler, the epoch log, the stop check) is a `Hook`, called outside
the timed part of a step, in the spirit of Keras's `CallbackList`.
"""

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Sequence


@dataclass
class StepRecord:
    """One step as the loop saw it: seconds blocked in `next()`, seconds in `step`, what it returned."""

    input_wait_s: float
    compute_s: float
    results: Any = None


class Hook:
    """A side concern of the loop. Steps are numbered 0.. across epochs; every method is optional."""

    def on_epoch_begin(self, epoch: int) -> None:
        pass

    def on_step_begin(self, step: int) -> None:
        pass

    def on_step_end(self, step: int, record: StepRecord) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        """`logs` is one dict per epoch that hooks fill in their order (epoch metrics first)."""

    def on_loop_end(self) -> None:
        """Called once, also when the loop raises: release what the hook holds (a trace)."""


class HookList(Hook):
    """Hooks called in order."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = list(hooks)

    def on_epoch_begin(self, epoch: int) -> None:
        for hook in self.hooks:
            hook.on_epoch_begin(epoch)

    def on_step_begin(self, step: int) -> None:
        for hook in self.hooks:
            hook.on_step_begin(step)

    def on_step_end(self, step: int, record: StepRecord) -> None:
        for hook in self.hooks:
            hook.on_step_end(step, record)

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        for hook in self.hooks:
            hook.on_epoch_end(epoch, logs)

    def on_loop_end(self) -> None:
        for hook in self.hooks:
            hook.on_loop_end()


def timed_loop(
    iterator: Iterator,
    step: Callable[[Any], Any],
    epochs: int,
    steps_per_epoch: int,
    hooks: Sequence[Hook] = (),
    first_epoch: int = 0,
) -> None:
    """Run epochs `first_epoch` .. `epochs - 1` of `steps_per_epoch` steps of `step(next(iterator))`,
    timing each one; steps are numbered from the first epoch's (a resumed run's earlier epochs count).

    Raises whatever `next`, `step` or a hook raises (a hook stops the loop by raising, e.g.
    KeyboardInterrupt from the stop check); `on_loop_end` runs in any case.
    """
    hook = HookList(hooks)
    try:
        for epoch in range(first_epoch, epochs):
            hook.on_epoch_begin(epoch)
            for index in range(steps_per_epoch):
                number = epoch * steps_per_epoch + index
                hook.on_step_begin(number)
                started = time.perf_counter()
                batch = next(iterator)
                fetched = time.perf_counter()
                results = step(batch)
                hook.on_step_end(number, StepRecord(fetched - started, time.perf_counter() - fetched, results))
            hook.on_epoch_end(epoch, {})
    finally:
        hook.on_loop_end()
