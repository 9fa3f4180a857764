"""The one timed loop, with hooks: training, `mode=input`, the ceilings and the benchmarks run it.

Each step is timed in two parts on the host's monotonic clock (`time.perf_counter`): the input
wait, blocked in `next(iterator)`, and the compute, from calling `step(batch)` until it returns;
around both, the process's CPU time (`time.process_time`, every thread of the process: the step's
ops and the input pipeline's), which says how many cores the step kept busy.
`step` must not return before the work it dispatched has finished, so that the compute time is
the step's: on a CPU a compiled call returns only when its work is done (eager execution is
synchronous), on a GPU or TPU once it is queued, so there the step reads its results on the host,
which waits for it (bwopt.train.calls_return_when_done).

Why not a lagged read (reading step n-1's results after dispatching step n): it would let step
n's `next()` overlap step n-1's device work, so the input wait would no longer be time the step
stood still, and each compute time would hold its neighbour's; the partition of the step
(bwopt.measure.timing) would lose its meaning. What the loop costs was measured against a
hand-written loop (benchmarks/vs_plain_loop.py, README there): on CPU, where the results stay
tensors until the hooks read many steps' at once, ~5 % of a 0.7 ms step (MLP 128) in paired
steps against a plain loop that calls its step as directly (bwopt.train.DirectCall), 1 % on
MLP 512-512 and a small CNN, 2026-12-04; a read every step cost ~2 % more. Where that matters,
the cure keeps the figures true: `train.steps_per_execution=N` pays the loop once per N steps.

Everything else a run does around its steps (the step timer, the progress bar, the profiler, the
epoch log, the stop check) is a `Hook`, called outside the timed part of a step, in the spirit of
Keras's `CallbackList`.
"""

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple


@dataclass
class StepRecord:
    """One step as the loop saw it: seconds blocked in `next()`, seconds in `step`, what it returned,
    and the process's CPU seconds over the step (every thread's: the step's and the pipeline's;
    None where the step ran in another process)."""

    input_wait_s: float
    compute_s: float
    results: Any = None
    cpu_s: Optional[float] = None


class Hook:
    """A side concern of the loop. Steps are numbered 0.. across epochs; every method is optional."""

    # Whether the hook also sees the extra timed steps after the last epoch (`extra_timed_steps`):
    # the step timer and the stop checks do; epoch logs, progress and the profiler do not.
    follows_extra_steps = False

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


class _Exhausted(Exception):
    """The loop's iterator ended: carried out of a step generator, where StopIteration cannot pass (PEP 479)."""


# Steps of one epoch, each as (its number across epochs, what the loop saw of it): a function of
# the epoch and the hooks, which it calls `on_step_begin` on before it starts each step.
EpochSteps = Callable[[int, Hook], Iterable[Tuple[int, StepRecord]]]


def drive(epoch_steps: EpochSteps, epochs: int, hooks: Sequence[Hook] = (), first_epoch: int = 0) -> None:
    """Epochs `first_epoch` .. `epochs - 1` of the steps `epoch_steps` yields, through `hooks`.

    The one place hooks are called: the timed loop below runs its steps through it, and so does
    the parameter-server mode, whose steps run on the workers and come back as records.
    Raises whatever a step or a hook raises (a hook stops the loop by raising, e.g.
    KeyboardInterrupt from the stop check); `on_loop_end` runs in any case.
    """
    hook = HookList(hooks)
    try:
        for epoch in range(first_epoch, epochs):
            hook.on_epoch_begin(epoch)
            for number, record in epoch_steps(epoch, hook):
                hook.on_step_end(number, record)
            hook.on_epoch_end(epoch, {})
    except _Exhausted as exhausted:
        raise StopIteration from exhausted.__cause__
    finally:
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

    Raises StopIteration when the iterator ends before the last step, and whatever `step` or a hook raises.
    """

    def epoch_steps(epoch: int, hook: Hook):
        first = epoch * steps_per_epoch
        return _timed_steps(iterator, step, range(first, first + steps_per_epoch), hook)

    drive(epoch_steps, epochs, hooks, first_epoch)


def extra_timed_steps(iterator: Iterator, step: Callable[[Any], Any], numbers: range, hooks: Sequence[Hook]) -> None:
    """More steps of `step(next(iterator))`, numbered `numbers`, after the epochs: through the hooks
    that follow extra steps only (`Hook.follows_extra_steps`), as one block with no epoch of its own."""
    followers = [hook for hook in hooks if hook.follows_extra_steps]
    drive(lambda epoch, hook: _timed_steps(iterator, step, numbers, hook), 1, followers)


def _timed_steps(iterator: Iterator, step: Callable[[Any], Any], numbers: range, hook: Hook):
    for number in numbers:
        hook.on_step_begin(number)
        cpu_started = time.process_time()  # outside the timed part: a read costs about 0.6 us
        started = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration as end:
            raise _Exhausted from end
        fetched = time.perf_counter()
        results = step(batch)
        ended = time.perf_counter()
        cpu_s = time.process_time() - cpu_started
        yield number, StepRecord(fetched - started, ended - fetched, results, cpu_s)
