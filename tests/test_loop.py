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


@pytest.mark.timing
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


def spin_cpu(seconds: float) -> None:
    """Busy on this thread until the process has spent `seconds` more CPU time."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


@pytest.mark.timing
def test_each_step_records_the_cpu_time_the_process_spent_in_it():
    """A step that spins for 20 ms of CPU spent at least that (and no more CPU than one thread
    gives in its wall time, plus the loop's own reads); a step that sleeps spent almost none.
    Both hold on a loaded machine: a spin measured by CPU time lasts longer in wall time there."""
    timer = StepTimer()
    timed_loop(iter([spin_cpu, time.sleep]), lambda work: work(0.02), 1, 2, [timer])
    (spun, slept), (spun_wall, slept_wall) = timer.cpu_s, timer.compute_s
    assert 0.02 <= spun <= spun_wall + 0.002
    assert slept < 0.005 and slept_wall >= 0.02


def test_cores_busy_is_the_cpu_time_over_the_wall_time_of_the_timed_steps():
    timer = StepTimer()
    for step in range(40):
        timer.record(0.001, 0.003, 0.006 if step % 2 else 0.002)  # 0.004 CPU-s a 0.004 s step: one core
    figures = timing_figures(timer, StepPlan(1, 40, 8), 32, 320)
    assert figures.cores_busy == pytest.approx(1.0)
    assert figures.cpu_s_per_example == pytest.approx(0.004 / 32)
    low, high = figures.cores_busy_ci95
    assert low <= 1.0 <= high and high - low < 0.5
    metrics = figures.metrics()
    assert metrics["cores_busy"] == pytest.approx(1.0) and metrics["cores_busy_ci95_low"] == low


def test_steps_whose_cpu_time_was_not_read_give_no_cores_busy():
    timer = StepTimer()
    for step in range(20):
        timer.record(0.001, 0.003, None if step == 15 else 0.004)  # a step run by another process
    figures = timing_figures(timer, StepPlan(1, 20, 4), 32, 320)
    assert figures.cores_busy is None and figures.cpu_s_per_example is None and figures.cores_busy_ci95 is None
    assert "cores_busy" not in figures.metrics()
