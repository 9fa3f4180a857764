"""The timed loop: what it times, the order it calls hooks in, and that hooks always end."""

import time

import pytest

from bwopt.loop import Hook, timed_loop
from bwopt.measure import StepPlan, StepTimer, timing_figures


class Calls(Hook):
    def __init__(self):
        self.calls = []

    def on_epoch_begin(self, epoch):
        self.calls.append(("epoch_begin", epoch))

    def on_step_begin(self, step):
        self.calls.append(("step_begin", step))

    def on_step_end(self, step, record):
        self.calls.append(("step_end", step, record.results))

    def on_epoch_end(self, epoch, logs):
        logs["seen_by"] = logs.get("seen_by", 0) + 1
        self.calls.append(("epoch_end", epoch, dict(logs)))

    def on_loop_end(self):
        self.calls.append(("loop_end",))


def test_hooks_are_called_in_order_with_global_step_numbers_and_shared_epoch_logs():
    first, second = Calls(), Calls()
    timed_loop(iter(range(10)), lambda batch: batch * 10, 2, 2, [first, second])
    assert first.calls == [
        ("epoch_begin", 0),
        ("step_begin", 0),
        ("step_end", 0, 0),
        ("step_begin", 1),
        ("step_end", 1, 10),
        ("epoch_end", 0, {"seen_by": 1}),
        ("epoch_begin", 1),
        ("step_begin", 2),
        ("step_end", 2, 20),
        ("step_begin", 3),
        ("step_end", 3, 30),
        ("epoch_end", 1, {"seen_by": 1}),
        ("loop_end",),
    ]
    # One logs dict per epoch, filled by the hooks in their order.
    assert second.calls[5] == ("epoch_end", 0, {"seen_by": 2})


def sleepy_batches(seconds):
    while True:
        time.sleep(seconds)
        yield None


def test_input_wait_and_compute_are_the_known_sleeps():
    timer = StepTimer()
    timed_loop(sleepy_batches(0.02), lambda batch: time.sleep(0.01), 1, 6, [timer])
    figures = timing_figures(timer, StepPlan(1, 6, warmup_steps=1), examples_per_step=8, bytes_per_step=8)
    # Sleeps last at least as long as asked; a loaded machine adds to both, so the bounds are one-sided
    # below and generous above.
    assert all(wait >= 0.02 for wait in timer.input_wait_s)
    assert all(compute >= 0.01 for compute in timer.compute_s)
    assert figures.input_wait_fraction == pytest.approx(2 / 3, abs=0.12)
    assert figures.step_time_p50_s == pytest.approx(0.03, rel=0.5)


def test_a_raising_hook_stops_the_loop_and_every_hook_still_ends():
    class Stop(Hook):
        def on_step_end(self, step, record):
            if step == 2:
                raise KeyboardInterrupt("stopped by SIGTERM")

    timer, calls = StepTimer(), Calls()
    with pytest.raises(KeyboardInterrupt):
        timed_loop(iter(range(100)), lambda batch: batch, 10, 10, [timer, Stop(), calls])
    assert timer.num_steps == 3  # the step during which the stop came is recorded
    assert calls.calls[-1] == ("loop_end",)


def test_an_exhausted_iterator_ends_the_loop_with_stop_iteration():
    calls = Calls()
    with pytest.raises(StopIteration):
        timed_loop(iter(range(3)), lambda batch: batch, 1, 5, [calls])
    assert calls.calls[-1] == ("loop_end",)
