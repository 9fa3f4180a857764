import numpy as np
import pytest

from bwopt.measure import StepTimer, input_bound_verdict, jitter, timing_figures


def timer_of(input_wait, compute):
    timer = StepTimer()
    for wait, busy in zip(input_wait, compute):
        timer.record(wait, busy)
    return timer


def test_figures_of_a_known_timeline():
    # Two warm-up steps that must not count, then steps of 10 ms with 2 ms input wait.
    timer = timer_of([5.0, 5.0] + [0.002] * 10, [5.0, 5.0] + [0.008] * 10)
    figures = timing_figures(timer, warmup_steps=2, examples_per_step=32, bytes_per_step=32 * 100)
    assert figures.num_timed_steps == 10
    assert figures.timed_wall_s == pytest.approx(0.1)
    assert figures.throughput_examples_per_s == pytest.approx(3200.0)
    assert figures.throughput_bytes_per_s == pytest.approx(320_000.0)
    assert figures.step_time_p50_s == pytest.approx(0.010)
    assert figures.input_wait_fraction == pytest.approx(0.2)
    assert figures.input_bound_verdict == "highly input-bound"
    assert figures.step_time_jitter_s == pytest.approx(0.0)


def test_percentiles_match_numpy_and_ignore_warmup():
    rng = np.random.default_rng(0)
    steps = rng.exponential(0.01, size=500)
    timer = timer_of([100.0] + [0.0] * 500, [100.0] + list(steps))
    figures = timing_figures(timer, warmup_steps=1, examples_per_step=1, bytes_per_step=1)
    assert figures.step_time_p50_s == pytest.approx(np.percentile(steps, 50))
    assert figures.step_time_p90_s == pytest.approx(np.percentile(steps, 90))
    assert figures.step_time_p99_s == pytest.approx(np.percentile(steps, 99))
    assert figures.throughput_examples_per_s == pytest.approx(500 / steps.sum())


def test_jitter_is_robust_to_outliers_and_matches_sigma_for_normal_data():
    rng = np.random.default_rng(1)
    normal = rng.normal(0.01, 0.001, size=20_000)
    assert jitter(normal) == pytest.approx(0.001, rel=0.03)
    assert jitter(np.concatenate([normal, [10.0] * 50])) == pytest.approx(0.001, rel=0.05)


@pytest.mark.parametrize(
    "fraction,verdict",
    [(0.0, "not input-bound"), (0.0499, "not input-bound"), (0.05, "moderately input-bound"),
     (0.1999, "moderately input-bound"), (0.2, "highly input-bound"), (0.9, "highly input-bound")],
)
def test_verdict_uses_the_profiler_thresholds(fraction, verdict):
    assert input_bound_verdict(fraction) == verdict


def test_no_timed_step_is_an_error():
    with pytest.raises(ValueError, match="no step was timed"):
        timing_figures(timer_of([0.1] * 3, [0.1] * 3), warmup_steps=3, examples_per_step=1, bytes_per_step=1)
