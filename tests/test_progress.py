"""The progress line: terminals only, live examples/s, redraws bounded."""

import io

from bwopt.progress import ProgressBar


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand: 10 ms a step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_bar(stream, clock, epochs=2, steps_per_epoch=5):
    bar = ProgressBar(epochs, steps_per_epoch, examples_per_step=32, stream=stream, min_interval_s=0.0, clock=clock)
    for epoch in range(epochs):
        clock.now += 1.0  # validation between epochs: not part of the rate
        bar.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            clock.now += 0.010
            bar.on_step_end(epoch * steps_per_epoch + step)
        bar.on_epoch_end(epoch, {})
    return bar


def test_progress_bar_is_quiet_when_not_a_terminal():
    stream = io.StringIO()
    bar = run_bar(stream, Clock())
    assert not bar.enabled
    assert stream.getvalue() == ""


def test_progress_bar_on_a_terminal_shows_steps_and_live_examples_per_s():
    stream = FakeTerminal()
    run_bar(stream, Clock())
    redraws = stream.getvalue().split("\r")
    # 32 examples every 10 ms is 3,200 examples/s.
    assert "epoch 1/2  step 3/5  [############........]  3,200 examples/s" in redraws
    assert "epoch 2/2  step 5/5  [####################]  3,200 examples/s" in redraws
    # The epoch's end blanks the line (as long as the longest line) so a summary prints cleanly.
    longest = "epoch 2/2  step 5/5  [####################]  3,200 examples/s"
    assert redraws[-2] == " " * len(longest)


def test_progress_bar_redraws_at_most_every_interval_and_always_at_epoch_end():
    stream, clock = FakeTerminal(), Clock()
    bar = ProgressBar(1, 100, examples_per_step=10, stream=stream, min_interval_s=0.1, clock=clock)
    for step in range(100):
        clock.now += 0.004  # 100 steps of 4 ms: 0.4 s, so a redraw about every 25 steps
        bar.on_step_end(step)
    lines = [line for line in stream.getvalue().split("\r") if line]
    assert 4 <= len(lines) <= 5
    assert lines[-1].startswith("epoch 1/1  step 100/100")
    # Every redraw covers 25 steps of 10 examples in 0.1 s: 2,500 examples/s.
    assert all(line.endswith("2,500 examples/s") for line in lines)
