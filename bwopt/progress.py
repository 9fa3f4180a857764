"""The live progress line a person sees on a terminal while a run trains."""

import sys
import time
from typing import Callable, Dict, Optional, TextIO

from bwopt.loop import Hook, StepRecord

BAR_WIDTH = 20


class ProgressBar(Hook):
    """One `\\r`-redrawn line, `epoch 2/10  step 37/215  [####......]  3,201 examples/s`.

    Only a terminal gets it (`stream.isatty()`): logs and pipes stay quiet. The examples/s is
    live: the examples of the steps since the previous redraw (or `on_epoch_begin`) over the
    time since then. Redraws come at most every `min_interval_s`, so the bar costs the loop next
    to nothing; the last step of an epoch is always drawn, and `on_epoch_end` clears the line
    for the epoch's summary. A hook of the timed loop (bwopt.loop).
    """

    def __init__(
        self,
        epochs: int,
        steps_per_epoch: int,
        examples_per_step: int,
        stream: Optional[TextIO] = None,
        min_interval_s: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.examples_per_step = examples_per_step
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = self.stream.isatty()
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._drawn_at = clock()
        self._drawn_steps = 0
        self._line_length = 0

    def on_epoch_begin(self, epoch: int) -> None:
        """Restart the rate, so that time between epochs (validation) does not count."""
        self._drawn_at, self._drawn_steps = self.clock(), epoch * self.steps_per_epoch

    def on_step_end(self, step: int, record: Optional[StepRecord] = None) -> None:
        """After step `step` of the loop (0-based, counted across epochs)."""
        if not self.enabled:
            return
        now = self.clock()
        done = step + 1
        epoch, step = divmod(step, self.steps_per_epoch)
        last_of_epoch = step + 1 == self.steps_per_epoch
        if now - self._drawn_at < self.min_interval_s and not last_of_epoch:
            return
        examples_per_s = (done - self._drawn_steps) * self.examples_per_step / max(now - self._drawn_at, 1e-9)
        self._draw(self.line(epoch, step, examples_per_s))
        self._drawn_at, self._drawn_steps = now, done

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, float]] = None) -> None:
        """Clear the line so that the epoch's summary prints on a clean one."""
        if self.enabled and self._line_length:
            self._draw("")

    def line(self, epoch: int, step: int, examples_per_s: float) -> str:
        filled = BAR_WIDTH * (step + 1) // self.steps_per_epoch
        return (
            f"epoch {epoch + 1}/{self.epochs}  step {step + 1}/{self.steps_per_epoch}  "
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}]  {examples_per_s:,.0f} examples/s"
        )

    def _draw(self, text: str) -> None:
        # Pad with spaces so a shorter line fully covers the previous one.
        self.stream.write("\r" + text.ljust(self._line_length) + ("\r" if not text else ""))
        self.stream.flush()
        self._line_length = len(text)
