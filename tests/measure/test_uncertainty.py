"""Intervals, the step's partition and verdicts that hold only where their intervals clear the thresholds."""

import numpy as np
import pytest

from bwopt.measure import HostReferences, StepPlan, StepTimer, timing_figures
from bwopt.measure.plan import extra_steps_needed
from bwopt.measure.uncertainty import (
    PARTS,
    POCOCK_Z,
    compare,
    log_estimate,
    repeats_to_resolve,
    rounds_to_find,
    sequential_level,
    step_uncertainty,
    window_means_interval,
)
from bwopt.measure.verdicts import interval_verdict


def coverage(make_steps, true_throughput: float, trials: int = 150) -> float:
    """How often the throughput interval of a window covers the throughput the steps were drawn around."""
    covered = 0
    for trial in range(trials):
        steps = make_steps(np.random.default_rng(1000 + trial))
        zeros = np.zeros(len(steps))
        parts = {"compute": steps, "input_stall": zeros, "host_overhead": zeros, "other": zeros}
        low, high = step_uncertainty(parts, examples_per_loop_step=1.0).throughput_ci95
        covered += low <= true_throughput <= high
    return covered / trials


@pytest.mark.slow
def test_the_throughput_interval_covers_the_true_rate_about_95_percent_of_the_time():
    # Independent steps of 1 ms +- 0.2 ms: the rate is 1 / E[step] = 1000 steps/s.
    independent = coverage(lambda rng: rng.normal(1e-3, 2e-4, 300), 1000.0)
    assert 0.88 <= independent <= 0.99


@pytest.mark.slow
def test_blocks_keep_the_interval_honest_when_neighbouring_steps_are_alike():
    """Steps whose slowness lasts (an AR(1) series, as a busy machine gives): resampling single
    steps would claim too much; blocks of steps keep the coverage near 95 %."""

    def correlated(rng):
        noise = np.zeros(400)
        for index in range(1, 400):
            noise[index] = 0.8 * noise[index - 1] + rng.normal(0, 1e-4)
        return 1e-3 + noise

    assert coverage(correlated, 1000.0) >= 0.82


def figures_for(steps_per_execution: int):
    rng = np.random.default_rng(0)
    num = 200
    if steps_per_execution == 1:
        timer = StepTimer(list(rng.uniform(0.1e-3, 0.6e-3, num)), list(rng.uniform(0.4e-3, 0.6e-3, num)))
        references = HostReferences(0.1e-3, fetch_overhead_s=0.05e-3)
    else:
        timer = StepTimer([0.0] * num, list(rng.uniform(4e-3, 6e-3, num)))
        references = HostReferences(0.1e-3, ready_execution_s=4.5e-3)
    plan = StepPlan(1, num, 0, steps_per_execution=steps_per_execution)
    return timing_figures(timer, plan, 32, 32 * 10, references)


@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_the_step_partition_sums_to_one_and_no_part_exceeds_its_whole(steps_per_execution):
    figures = figures_for(steps_per_execution)
    assert set(figures.step_partition) == set(PARTS)
    assert sum(figures.step_partition.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(0.0 <= share <= 1.0 for share in figures.step_partition.values())
    assert figures.step_partition["input_stall"] == pytest.approx(figures.input_stall_fraction)
    assert figures.step_partition["host_overhead"] == pytest.approx(figures.host_overhead_fraction)
    for part, (low, high) in figures.step_partition_ci95.items():
        assert low <= figures.step_partition[part] + 1e-9 and figures.step_partition[part] <= high + 1e-9
    low, high = figures.throughput_examples_per_s_ci95
    assert low < figures.throughput_examples_per_s < high
    metrics = figures.metrics()
    assert metrics["throughput_examples_per_s_ci95_low"] == low
    assert metrics["step_partition/compute_fraction"] == figures.step_partition["compute"]


def test_every_interval_holds_its_figure_when_the_stall_is_clipped_at_zero():
    """Executions that average a hair below the ready reference: the window's stall sums below
    zero and moves into compute, which puts compute's share at the peak of its resamples (those
    slower than the reference have a stall, those faster less compute) -- above their 97.5th
    percentile. The interval is stretched to hold the share it qualifies."""
    for seed in range(5):
        executions = np.random.default_rng(seed).lognormal(np.log(2.5e-3), 0.2, 110)
        executions += 2.6e-3 - 1e-7 - executions.mean()
        references = HostReferences(0.3e-3, ready_execution_s=2.6e-3)
        figures = timing_figures(
            StepTimer([0.0] * 110, list(executions)), StepPlan(1, 110, 0, steps_per_execution=8), 32, 320, references
        )
        assert figures.step_partition["input_stall"] == 0.0
        for part, (low, high) in figures.step_partition_ci95.items():
            assert low <= figures.step_partition[part] <= high, part
        assert figures.step_partition_ci95["compute"][1] == figures.step_partition["compute"]
        low, high = figures.throughput_examples_per_s_ci95
        assert low <= figures.throughput_examples_per_s <= high


def test_with_n_steps_per_execution_the_stall_is_the_excess_over_ready_executions():
    figures = figures_for(8)
    # Each execution's excess over the 4.5 ms ready one is stall; one 0.1 ms dispatch is host overhead.
    mean_execution = figures.timed_wall_s / (figures.num_timed_steps / 8)
    assert figures.input_stall_fraction == pytest.approx(1 - 4.5e-3 / mean_execution)
    assert figures.host_overhead_fraction == pytest.approx(0.1e-3 / mean_execution)
    assert figures.input_wait_fraction == 0.0


@pytest.mark.parametrize(
    "stall,host,verdict",
    [
        ((0.30, 0.35), (0.05, 0.08), "highly input-bound"),
        ((0.06, 0.12), (0.02, 0.04), "moderately input-bound"),
        ((0.01, 0.03), (0.02, 0.04), "compute-bound"),
        ((0.10, 0.14), (0.40, 0.50), "host-overhead-bound"),
        # Both clear 20 %: both are named, whichever is larger (that changes from run to run).
        ((0.30, 0.40), (0.45, 0.55), "input- and host-overhead-bound"),
        ((0.24, 0.35), (0.22, 0.32), "input- and host-overhead-bound"),
        # Host overhead clears 20 %, the stall straddles it: what is known, not a guess.
        ((0.15, 0.25), (0.40, 0.50), "mixed: input stall 15–25 %, host overhead 40–50 %"),
        # The stall's interval straddles 20 % with little host overhead.
        ((0.17, 0.23), (0.02, 0.04), "mixed: input stall 17–23 %, host overhead 2–4 %"),
        # Host overhead straddles 20 %.
        ((0.40, 0.50), (0.18, 0.22), "mixed: input stall 40–50 %, host overhead 18–22 %"),
    ],
)
def test_a_verdict_is_given_only_where_its_interval_clears_the_thresholds(stall, host, verdict):
    assert interval_verdict(stall, host) == verdict


def drifting_stall(alternate_windows: bool):
    """3,000 steps of 1 ms on a fetch and a dispatch reference of 0.05 ms each: the stall is 10 % of
    the step in half of them and 30 % in the other half, either by half-second windows (a drift the
    steps' blocks cannot see) or step by step (no drift: every window reads 20 %)."""
    if alternate_windows:
        high = (np.arange(3000) // 500) % 2 == 1
    else:
        high = np.arange(3000) % 2 == 1
    wait = np.where(high, 0.35e-3, 0.15e-3)
    timer = StepTimer(list(wait), list(1e-3 - wait))
    references = HostReferences(dispatch_overhead_s=0.05e-3, fetch_overhead_s=0.05e-3)
    return timing_figures(timer, StepPlan(1, 3000, 0), 10, 10, references)


def test_a_share_that_drifts_between_half_second_windows_gets_the_windows_interval():
    drifting, even = drifting_stall(True), drifting_stall(False)
    assert drifting.input_stall_fraction == pytest.approx(0.2) and even.input_stall_fraction == pytest.approx(0.2)
    # six windows at 10, 30, 10, 30, 10, 30 %: 20 % +- t(5) x 10.95 % / sqrt(6) = +-11.5 points
    low, high = drifting.input_stall_fraction_ci95
    assert low == pytest.approx(0.085, abs=0.002) and high == pytest.approx(0.315, abs=0.002)
    assert drifting.verdict.startswith("mixed")  # 20 % +- 11.5 points straddles both stall thresholds
    assert drifting.input_wait_fraction_ci95[1] - drifting.input_wait_fraction_ci95[0] > 0.2
    low, high = even.input_stall_fraction_ci95  # no drift: the steps' own interval, narrow
    assert high - low < 0.01
    for figures in (even, drifting):  # host overhead: 0.1 ms of every step, no drift
        assert figures.host_overhead_fraction_ci95 == pytest.approx([0.1, 0.1])


def test_the_windows_interval_needs_three_windows_and_centres_on_the_figure():
    part, step = np.array([1.0, 3.0, 1.0, 3.0]), np.full(4, 10.0)
    cuts = [slice(0, 2), slice(2, 4)]
    assert window_means_interval(part, step, cuts, 0.2) is None
    low, high = window_means_interval(part, step, [slice(index, index + 1) for index in range(4)], 0.2)
    half = 3.182446 * np.std([0.1, 0.3, 0.1, 0.3], ddof=1) / 2  # t(3) at 95 %
    assert (low, high) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-5)


def test_comparisons_say_faster_slower_or_no_difference_with_the_ratios_interval():
    fast = log_estimate([1100.0, 1120.0, 1090.0], [[1080.0, 1130.0]] * 3)
    slow = log_estimate([1000.0, 990.0, 1010.0], [[980.0, 1020.0]] * 3)
    faster = compare(fast, slow)
    assert faster.word == "faster" and faster.ci95[0] > 1 and faster.ratio == pytest.approx(1.1, abs=0.01)
    assert compare(slow, fast).word == "slower"
    noisy = log_estimate([1050.0, 950.0], [[800.0, 1300.0]] * 2)
    tie = compare(noisy, slow)
    assert tie.word == "no difference detected" and tie.ci95[0] < 1 < tie.ci95[1]
    assert repeats_to_resolve(tie, 2) > 2
    assert "×" in faster.sentence("a", "b") and "95 % CI" in faster.sentence("a", "b")


@pytest.mark.parametrize("looks", sorted(POCOCK_Z))
def test_a_comparison_looked_at_again_after_more_runs_errs_no_more_often_than_one_95_percent_look(looks):
    """Simulated without any difference: a statistic over the runs so far, looked at after each of
    `looks` equal batches of runs. Two-sided at 95 % on every look, some look calls noise a
    difference 8 % (2 looks) to 14 % (5) of the time; at `sequential_level(looks)` on every look,
    5 %, as one look at 95 %."""
    from statistics import NormalDist

    rng = np.random.default_rng(looks)
    sums = np.cumsum(rng.standard_normal((200_000, looks)), axis=1)
    z = np.abs(sums / np.sqrt(np.arange(1, looks + 1)))
    per_look = NormalDist().inv_cdf(0.5 + sequential_level(looks) / 2)
    assert np.mean(np.any(z > per_look, axis=1)) == pytest.approx(0.05, abs=0.003)
    if looks > 1:
        assert np.mean(np.any(z > 1.959964, axis=1)) > 0.075
    assert sequential_level(looks) == pytest.approx(0.95) if looks == 1 else sequential_level(looks) > 0.95
    # the same two estimates, compared at a later look's level: the same ratio, a wider interval
    a, b = log_estimate([1100.0, 1120.0], [[1080.0, 1130.0]] * 2), log_estimate([1000.0, 990.0], [[980.0, 1020.0]] * 2)
    once, sequential = compare(a, b), compare(a, b, sequential_level(looks))
    assert sequential.ratio == once.ratio and sequential.ci95[0] <= once.ci95[0] <= once.ci95[1] <= sequential.ci95[1]


def test_the_rounds_priced_for_a_gain_find_it_about_four_times_in_five():
    """Runs whose log throughput scatters by 10 %, two a side a round, a true ×1.2: after one
    round the comparison is undecided more often than not; the rounds `rounds_to_find` prices
    from that round's interval find the gain, in simulation with the same estimates, at least
    four times in five."""
    rng = np.random.default_rng(3)

    def comparison(rounds: int):
        candidate = np.exp(np.log(1.2) + rng.normal(0.0, 0.1, 2 * rounds)) * 1000
        incumbent = np.exp(rng.normal(0.0, 0.1, 2 * rounds)) * 1000
        spread = (0.1, 1000)  # the spread known, as a long tuning's pooled one nearly is
        return compare(
            log_estimate(candidate, [None] * len(candidate), spread),
            log_estimate(incumbent, [None] * 2 * rounds, spread),
        )

    first = comparison(1)
    needed = rounds_to_find(first, 1, 1.2)
    assert needed == 3  # (1.96 + 0.84)^2 x 0.1^2 / log(1.2)^2 = 2.4
    assert np.mean([comparison(1).word == "faster" for _ in range(2000)]) < 0.6
    assert np.mean([comparison(needed).word == "faster" for _ in range(2000)]) >= 0.8
    assert rounds_to_find(first, 1, 1.0) is None and rounds_to_find(first, 1, 0.9) is None
    assert rounds_to_find(first, 1, 1.5) < needed < rounds_to_find(first, 1, 1.1)


def test_a_window_of_a_few_steps_gets_an_interval_that_is_not_a_point():
    """3 timed steps of 10 and 12 ms: too few for two blocks of 4, so the blocks are single steps;
    one block would resample the window unchanged ([x, x]), and a change would then be 'faster'
    by any margin at all (a tuning trial of 3 steps kept a ×1.13 change that way)."""
    steps = np.array([0.010, 0.012, 0.010])
    zeros = np.zeros(3)
    parts = {"compute": steps, "input_stall": zeros, "host_overhead": zeros, "other": zeros}
    low, high = step_uncertainty(parts, examples_per_loop_step=1.0).throughput_ci95
    assert 1 / 0.012 <= low < 3 / steps.sum() < high <= 1 / 0.010


def test_one_run_with_no_interval_is_no_evidence_either_way():
    unknown = log_estimate([1130.0], [None])
    assert unknown[1] == float("inf")
    assert log_estimate([1130.0], [[1130.0, 1130.0]])[1] == float("inf")  # one timed step: zero width
    known = log_estimate([1000.0], [[980.0, 1020.0]])
    assert compare(unknown, known).word == "no difference detected"
    assert repeats_to_resolve(compare(unknown, known), 1) is None


def test_a_short_window_asks_for_enough_extra_steps_and_their_warm_up():
    timer = StepTimer([0.0] * 20, [1e-3] * 20)  # 20 steps of 1 ms, 15 of them timed: 15 ms
    plan = StepPlan(2, 10, 5, epoch_warmup_steps=2)
    assert plan.timed(20) == [5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18, 19]
    needed = extra_steps_needed(timer, plan, min_timed_s=0.1)
    assert needed == 2 + int(np.ceil((0.1 - 0.013) / 1e-3 * 1.05))  # the warm-up, then 87 ms and 5 % to spare
    extended = StepPlan(2, 10, 5, epoch_warmup_steps=2, extra_steps=needed)
    assert extended.timed(20 + needed)[13:15] == [22, 23]  # 20 and 21: the extra steps' warm-up
    assert extra_steps_needed(timer, plan, min_timed_s=0.01) == 0


@pytest.mark.slow
def test_the_timed_window_lasts_measure_min_timed_s_and_leaves_the_epoch_metrics_alone(run_experiment):
    tiny = ["train.epochs=2", "train.steps_per_epoch=6", "train.warmup_steps=2", "measure.memcpy_bandwidth=false"]
    short = run_experiment(*tiny, "tracking=none", "measure.min_timed_s=0")
    long = run_experiment(*tiny, "tracking=none", "measure.min_timed_s=0.5")
    assert short.figures.num_timed_steps == 2 * (6 - 2)
    assert long.figures.timed_wall_s >= 0.5 and long.figures.num_timed_steps > 4 * short.figures.num_timed_steps
    # The extra steps come after the last epoch's metrics: the same training up to there.
    assert long.final_metrics == short.final_metrics


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_a_real_runs_summary_json_holds_a_partition_that_adds_up_and_every_interval(
    run_experiment, tmp_path, steps_per_execution
):
    import json

    tiny = ["train.epochs=2", "train.warmup_steps=8", "measure.memcpy_bandwidth=false", "tracking=none"]
    run_experiment(*tiny, f"train.steps_per_execution={steps_per_execution}", "measure.min_timed_s=0.3")
    figures = json.loads((tmp_path / "run" / "summary.json").read_text())["figures"]
    partition = figures["step_partition"]
    assert set(partition) == set(PARTS) and sum(partition.values()) == pytest.approx(1.0, abs=0.005)
    for part, share in partition.items():
        low, high = figures["step_partition_ci95"][part]
        assert 0.0 <= low <= share + 1e-9 <= high + 2e-9 <= 1.0 + 2e-9
    low, high = figures["throughput_examples_per_s_ci95"]
    assert low < figures["throughput_examples_per_s"] < high
    for share in ("input_wait_fraction", "input_stall_fraction", "host_overhead_fraction"):
        low, high = figures[f"{share}_ci95"]
        assert low <= figures[share] + 1e-9 and figures[share] <= high + 1e-9


def test_a_series_that_rides_along_does_not_set_the_blocks_of_the_step_time():
    """The blocks are as long as the step time stays alike: a strongly trending extra series (the
    CPU time of a machine warming up, say) must not lengthen them and so move the throughput's interval."""
    rng = np.random.default_rng(3)
    steps = rng.normal(1e-3, 2e-4, 300)  # independent steps: short blocks
    zeros = np.zeros(len(steps))
    parts = {"compute": steps, "input_stall": zeros, "host_overhead": zeros, "other": zeros}
    alone = step_uncertainty(parts, examples_per_loop_step=1.0)
    ramp = np.linspace(0.0, 1.0, len(steps))  # lag-1 correlation ~1, and large beside the steps
    with_series = step_uncertainty(parts, examples_per_loop_step=1.0, series={"cpu": ramp})
    assert with_series.throughput_ci95 == alone.throughput_ci95
