"""Every benchmark script stays runnable: each runs once in its short smoke form.

Scripts run in a fresh process (each fixes TensorFlow's devices itself). Marked `slow`: each
smoke run takes 3-15 s on 2 cores. Figures are not asserted here (a shared machine); the scripts
print their ratios, and each must print the line its figure is read from.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bwopt.quiet import ABSL_BANNER

REPO = Path(__file__).resolve().parents[2]
# script: a line it must print
SMOKE_SCRIPTS = {
    "vs_plain_loop.py": "paired steps bwopt / plain loop",
    "vs_keras_fit.py": "(fit's best N)",
    "pipeline_payoff.py": "tuned throughput / min(ceilings)",
    "tracking_overhead.py": "ratio throughput tracking on/off",
    "cli_latency.py": "wall time python -m bwopt pipeline.prefetch=-1",
    "input_bandwidth.py": "ratio input bytes/s / host memcpy, bfloat16",
    "startup_records.py": "ratio first/later",
    "jpeg_pipeline.py": "ratio bwopt mode=input / hand-written tf.data",
    "tune_payoff.py": "ratio tune throughput / min(ceilings)",
    "machine_noise.py": "series of the shared pool",
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE_SCRIPTS))
def test_benchmark_runs_in_smoke_form_and_prints_its_ratios(script):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BWOPT_BENCHMARK_SMOKE": "1", "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert SMOKE_SCRIPTS[script] in result.stdout, result.stdout[-2000:]
    # Its own lines only: TensorFlow's start-up chatter is dropped as in a run (bwopt.quiet).
    assert ABSL_BANNER not in result.stderr and "oneDNN custom operations" not in result.stderr, result.stderr[-2000:]


def test_every_benchmark_script_has_a_smoke_test_or_is_known_not_to():
    scripts = {path.name for path in (REPO / "benchmarks").glob("*.py") if not path.name.startswith("_")}
    assert scripts - set(SMOKE_SCRIPTS) == {"run_all.py", "timing_overhead.py"}


def test_a_benchmarks_interval_holds_the_true_value_95_percent_of_the_time_even_with_three_rounds():
    """Rounds that scatter by 8 % around a known ratio: the printed interval covers it in ~95 % of
    benchmarks of 3 rounds (their min-max, what a bootstrap of the median gave, covers its median
    only 75 % of the time), so a target is not called met on the rounds' luck."""
    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from _common import interval95, verdict
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    rng = np.random.default_rng(0)
    rounds = np.exp(rng.normal(np.log(1.05), 0.08, size=(4000, 3)))
    covered = np.mean([low <= 1.05 <= high for low, high in map(interval95, rounds)])
    assert 0.93 <= covered <= 0.97
    assert 0.70 <= np.mean((rounds.min(axis=1) <= 1.05) & (1.05 <= rounds.max(axis=1))) <= 0.80
    # the same configuration read 1.03, 1.08 and 1.09 against itself: not a win
    assert verdict([1.03, 1.08, 1.09], 1.0) == "within noise of the target"
    assert verdict([3.47, 3.62, 3.68], 1.0) == "target met" and verdict([0.5], 1.0) == "target missed"


def test_a_benchmarks_printed_figure_is_the_centre_of_its_interval_not_the_median():
    """Ratios with a few slow outliers: the median lies outside the interval of the mean of the
    logs; the printed figure is the geometric mean, inside it, and the median follows it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from _common import interval95, spread, typical
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    values = [0.64] * 6 + [1.5] * 4
    low, high = interval95(values)
    assert not low <= 0.64 <= high and low <= typical(values) <= high
    assert abs(typical(values) - (0.64**6 * 1.5**4) ** 0.1) < 1e-12 and typical([-1.0, 3.0]) == 1.0
    said = f"{typical(values):.2f} (95 % CI {low:.2f}–{high:.2f}; median 0.64, min 0.64, max 1.50)"
    assert spread(values, ".2f") == said


def test_machine_noises_correlation_interval_holds_the_true_correlation_95_percent_of_the_time():
    """Windows drawn with a known correlation (0.6, 40 windows, as machine_noise.py takes): its
    Fisher interval covers it in ~95 % of draws; with no relation, ~2.5 % of draws call a positive one."""
    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from machine_noise import correlation
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    rng = np.random.default_rng(0)
    covered = []
    for _ in range(2000):
        x, noise = rng.normal(size=(2, 40))
        r, low, high = correlation(list(x), list(0.6 * x + 0.8 * noise))
        covered.append(low <= 0.6 <= high)
        assert low <= r <= high
    assert 0.93 <= np.mean(covered) <= 0.97
    called = [correlation(list(x), list(y))[1] > 0 for x, y in rng.normal(size=(2000, 2, 40))]
    assert 0.01 <= np.mean(called) <= 0.045  # one side of a 95 % interval: 2.5 %


def test_the_payoff_says_whether_the_side_by_side_runs_reproduce_the_tunings_claim():
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from tune_payoff import reproduced
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    def runs(throughputs, accuracy):
        return [
            SimpleNamespace(
                figures=SimpleNamespace(throughput_examples_per_s=value), final_metrics={"val_accuracy": accuracy}
            )
            for value in throughputs
        ]

    claimed = "tuned: ×4.1 over the start (95 % CI ×3.5–×4.7), 1.05 of the cores ceiling, 14 runs, 5 min"
    start = runs([1000, 1100, 900], 1.0)
    assert reproduced(claimed, {"tune": runs([4000, 4620, 3690], 0.99), "start": start}) == (
        "reproduced: re-measured tune / start ×4.10, the tuning's ×4.1 (95 % CI ×3.5–×4.7): within its interval; "
        "val_accuracy (median) tune 0.990, start 1.000: not 0.03 below"
    )
    line = reproduced(claimed, {"tune": runs([2000, 2200, 1800], 0.95), "start": start})
    assert "×2.00, the tuning's ×4.1 (95 % CI ×3.5–×4.7): outside its interval" in line
    assert line.endswith("tune 0.950, start 1.000: more than 0.03 below")
    kept_nothing = reproduced(
        "tuned: the start as given, no change run, 2 runs, 3 min", {"tune": start, "start": start}
    )
    assert kept_nothing.startswith("reproduced: the tuning kept no change, the same configuration re-measured: 1.00")
    assert "within noise of 1; val_accuracy" in kept_nothing
    # ×4.74 where the line reads ×4.7, rounded from up to ×4.75: within; ×4.80 is outside
    at_the_edge = reproduced(claimed, {"tune": runs([4740, 5214, 4266], 1.0), "start": start})
    assert "×4.74, the tuning's ×4.1 (95 % CI ×3.5–×4.7): within its interval" in at_the_edge
    assert "×4.80, the tuning's ×4.1 (95 % CI ×3.5–×4.7): outside" in reproduced(
        claimed, {"tune": runs([4800, 5280, 4320], 1.0), "start": start}
    )
    nothing = "tuned: nothing measured to compare, 2 runs, 1 min"
    assert (
        reproduced(nothing, {"tune": start, "start": start})
        == f"reproduced: nothing to compare (the tuning's line: {nothing})"
    )
