"""Stopping a run by signal: SIGINT or SIGTERM ends it between two steps, as KILLED."""

import signal
from typing import Optional

from bwopt.loop import Hook, StepRecord


class GracefulStop:
    """SIGINT or SIGTERM ends the run between two steps, as KILLED, with what it measured.

    Raising from the signal handler itself would interrupt TensorFlow inside an iterator's
    `get_next`, which can corrupt its heap; so the first signal only asks the loop to stop at
    the next step boundary, and a second one stops at once.
    """

    def __init__(self) -> None:
        self.requested: Optional[str] = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        already = self.requested
        self.requested = signal.Signals(signum).name
        if already:
            raise KeyboardInterrupt(f"stopped at once by a second {self.requested}")

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"stopped by {self.requested}")


STOP = GracefulStop()


class StopCheck(Hook):
    """Raise KeyboardInterrupt at the end of the step during which a stop was asked for."""

    def on_step_end(self, step: int, record: StepRecord) -> None:
        STOP.check()
