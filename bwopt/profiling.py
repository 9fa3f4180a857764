"""A TensorBoard profiler trace of a chosen range of training steps."""

from typing import Optional, Sequence

from bwopt.loop import Hook, StepRecord


class StepProfiler(Hook):
    """Trace the consecutive `steps` (0-based step numbers of the timed loop) with the TF Profiler.

    The trace starts in `on_step_begin(start_step)` and stops in `on_step_end` of the last
    step, so it holds exactly those steps; each one is marked as a `train` step with its
    number, which TensorBoard's overview and step-time pages read. The profile is written to
    `logdir/plugins/profile/<timestamp>/<host>.xplane.pb`. No steps: nothing is traced. A hook of
    the timed loop (bwopt.loop); the trace is closed when the loop ends, also by an exception.
    Profiling slows the traced steps: keep them out of the timed ones, or read their timing
    with that in mind.
    """

    def __init__(self, logdir: str, steps: Sequence[int]) -> None:
        self.logdir = logdir
        self.start_step = steps[0] if steps else 0
        self.num_steps = len(steps)
        self.running = False
        self._step_trace: Optional[object] = None

    def on_step_begin(self, step: int) -> None:
        import tensorflow as tf

        if self.num_steps > 0 and step == self.start_step:
            tf.profiler.experimental.start(self.logdir)
            self.running = True
        if self.running:
            self._step_trace = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
            self._step_trace.__enter__()

    def on_step_end(self, step: int, record: Optional[StepRecord] = None) -> None:
        if self._step_trace is not None:
            self._step_trace.__exit__(None, None, None)
            self._step_trace = None
        if self.running and step >= self.start_step + self.num_steps - 1:
            self.close()

    def on_loop_end(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop a running trace and write it (a run that ends or fails inside the range)."""
        import tensorflow as tf

        if self._step_trace is not None:
            self._step_trace.__exit__(None, None, None)
            self._step_trace = None
        if self.running:
            tf.profiler.experimental.stop()
            self.running = False
