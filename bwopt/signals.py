"""Stopping a run by signal: SIGINT or SIGTERM ends it between two steps, as KILLED."""

import contextlib
import signal
import sys
from typing import Optional

from bwopt.loop import Hook, StepRecord


class GracefulStop:
    """SIGINT or SIGTERM ends the run between two steps, as KILLED, with what it measured.

    Raising from the signal handler itself would interrupt TensorFlow inside an iterator's
    `get_next`, which can corrupt its heap; so the first signal only asks the loop to stop at
    the next step boundary, and a second one stops at once. While the run records what it
    measured (`finishing`), a second signal is noted, not raised, so the figures are kept; a
    third one stops at once. While the run waits on something outside the process
    (`interruptible`: the tracking store), the first signal stops at once: nothing of
    TensorFlow's is interrupted there, and the wait must not hold the stop back.
    """

    def __init__(self) -> None:
        self.requested: Optional[str] = None
        self.finishing = False
        self.num_signals = 0
        self.waiting_outside = False

    @contextlib.contextmanager
    def interruptible(self):
        """A wait on another process or machine, during which the first signal raises at once."""
        before, self.waiting_outside = self.waiting_outside, True
        try:
            yield
        finally:
            self.waiting_outside = before

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.num_signals += 1
        self.requested = signal.Signals(signum).name
        if self.finishing and self.num_signals == 2:
            print("bwopt: keeping what was measured; a third signal stops at once", file=sys.stderr, flush=True)
            return
        if self.num_signals > 1 or (self.waiting_outside and not self.finishing):
            raise KeyboardInterrupt(f"stopped at once by {self.requested}")

    @property
    def exit_code(self) -> int:
        """The shell's code for death by the signal that stopped the run: 130 SIGINT, 143 SIGTERM."""
        return 128 + signal.Signals[self.requested or "SIGINT"].value

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"stopped by {self.requested}")


STOP = GracefulStop()


class StopCheck(Hook):
    """Raise KeyboardInterrupt at the end of the step during which a stop was asked for."""

    def on_step_end(self, step: int, record: StepRecord) -> None:
        STOP.check()
