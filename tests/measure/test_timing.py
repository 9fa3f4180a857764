from dataclasses import replace

import numpy as np
import pytest
from conftest import known_answer

from bwopt.measure import StepPlan, StepTimer, input_bound_verdict, jitter, timing_figures


def plan(num_steps, warmup_steps):
    return StepPlan(1, num_steps, warmup_steps)


def timer_of(input_wait, compute):
    timer = StepTimer()
    for wait, busy in zip(input_wait, compute):
        timer.record(wait, busy)
    return timer


def test_figures_of_a_known_timeline():
    # Two warm-up steps that must not count, then steps of 10 ms with 2 ms input wait.
    timer = timer_of([5.0, 5.0] + [0.002] * 10, [5.0, 5.0] + [0.008] * 10)
    figures = timing_figures(timer, plan(12, 2), examples_per_step=32, bytes_per_step=32 * 100)
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
    figures = timing_figures(timer, plan(501, 1), examples_per_step=1, bytes_per_step=1)
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
    [
        (0.0, "not input-bound"),
        (0.0499, "not input-bound"),
        (0.05, "moderately input-bound"),
        (0.1999, "moderately input-bound"),
        (0.2, "highly input-bound"),
        (0.9, "highly input-bound"),
    ],
)
def test_verdict_uses_the_profiler_thresholds(fraction, verdict):
    assert input_bound_verdict(fraction) == verdict


def test_step_plan_leaves_out_warmup_later_epoch_starts_and_profiled_steps():
    steps = StepPlan(epochs=3, steps_per_epoch=5, warmup_steps=2, epoch_warmup_steps=1, profiled=(7, 8))
    assert steps.num_steps == 15
    assert steps.timed() == [2, 3, 4, 6, 9, 11, 12, 13, 14]
    # A loop that stopped after 8 steps: only the steps that ran count.
    assert steps.timed(8) == [2, 3, 4, 6]


def test_figures_of_a_loop_stopped_early_use_the_steps_that_ran():
    timer = timer_of([0.001] * 4, [0.009] * 4)
    figures = timing_figures(timer, StepPlan(2, 5, warmup_steps=1, epoch_warmup_steps=1), 10, 10)
    assert figures.num_timed_steps == 3 and figures.throughput_examples_per_s == pytest.approx(1000.0)


def test_no_timed_step_is_an_error():
    with pytest.raises(ValueError, match="no step was timed"):
        timing_figures(timer_of([0.1] * 3, [0.1] * 3), plan(3, 3), examples_per_step=1, bytes_per_step=1)


# ---- Ceilings, efficiency and the recommendation ----------------------------------------------

from bwopt.measure import Ceilings, PipelineKnobs, efficiency, recommend  # noqa: E402


def test_efficiency_divides_by_the_lower_measured_ceiling():
    assert efficiency(3000.0, 10_000.0, 4000.0) == pytest.approx(0.75)  # input is the lower ceiling
    assert efficiency(3000.0, 6000.0, None) == pytest.approx(0.5)
    assert efficiency(3000.0, None, None) is None


def test_ceilings_metrics_hold_the_measured_ones_only():
    assert Ceilings(compute_examples_per_s=9000.0).metrics() == {"compute_ceiling_examples_per_s": 9000.0}
    assert Ceilings(None, 4000.0, 48_000.0).metrics() == {
        "input_ceiling_examples_per_s": 4000.0,
        "input_ceiling_bytes_per_s": 48_000.0,
    }


def figures_with_input_wait(input_wait_s: float, compute_s: float, num_steps: int = 20):
    """Figures of `num_steps` identical steps of 32 examples (warm-up 0)."""
    return timing_figures(
        timer_of([input_wait_s] * num_steps, [compute_s] * num_steps), plan(num_steps, 0), 32, 32 * 100
    )


def test_recommendation_for_an_input_bound_run_names_the_knobs_that_are_off():
    # 4.3 ms waiting out of a 10 ms step: 43 %, 3,200 examples/s.
    figures = figures_with_input_wait(0.0043, 0.0057)
    text = recommend(
        figures,
        PipelineKnobs(prefetch=0, map_parallelism=1, cache="memory", transfer_dtype="uint8"),
        compute_ceiling_examples_per_s=6000.0,
        input_ceiling_examples_per_s=3500.0,
    )
    assert text == (
        "highly input-bound: 43 % of step time waits for input at 3,200 examples/s "
        "(compute alone 6,000, input alone 3,500 examples/s). "
        "prefetch is 0, map runs serially; try pipeline=tuned"
    )
    text = recommend(
        figures_with_input_wait(0.001, 0.009),
        PipelineKnobs(
            prefetch="autotune", map_parallelism="autotune", cache="off", transfer_dtype="float32", num_parallel_reads=1
        ),
    )
    assert text.startswith("moderately input-bound: 10 % of step time waits for input at 3,200 examples/s. ")
    assert "files are read one at a time, nothing is cached, features cross as float32" in text


def test_an_input_bound_run_at_its_cores_ceiling_is_told_to_spend_less_cpu_not_to_overlap_more():
    figures = figures_with_input_wait(0.0043, 0.0057)  # 3,200 examples/s
    knobs = PipelineKnobs(prefetch=0, map_parallelism=1, cache="off", transfer_dtype="float32")

    def advice(figures, cores=3300.0, **extra) -> str:
        ceilings = dict(compute_ceiling_examples_per_s=6000.0, input_ceiling_examples_per_s=3500.0)
        return recommend(figures, knobs, **ceilings, cores_ceiling_examples_per_s=cores, **extra)

    text = advice(figures)
    assert "Every core is busy: training runs at 97% of the cores ceiling (3,300 examples/s" in text
    assert "spend less CPU per example" in text and "try pipeline=tuned" not in text
    # With the cores the steps kept busy measured, the sentence quotes them.
    text = advice(replace(figures, cores_busy=1.953))
    assert "Every core is busy (1.95 cores, measured over the timed steps): training runs at 97%" in text
    assert "(3,300 examples/s, the step's and the pipeline's CPU time per example together)" in text
    # A step that spans both cores holds them while it runs, though they idle between its ops.
    text = advice(replace(figures, cores_busy=1.69), step_cores=2)
    assert "Every core is busy (1.69 cores, measured over the timed steps; the step holds 2 while it runs)" in text
    assert "(3,300 examples/s, the step's 2 cores for its time and the pipeline's CPU time per example" in text
    # A cores ceiling above another ceiling, or one training is far from, is not the limit.
    for cores in (4000.0, 4500.0):
        text = advice(figures, cores)
        assert "Every core is busy" not in text and "try pipeline=tuned" in text


def test_the_cores_ceiling_is_the_cores_over_both_sides_cpu_per_example():
    ceilings = Ceilings.from_blocks([100.0], [50.0], [5.0], [0.002, 0.004, 0.003], [0.010, 0.012], cores=2)
    metrics = ceilings.metrics()
    assert metrics["compute_cpu_s_per_example"] == pytest.approx(0.003)
    assert metrics["input_cpu_s_per_example"] == pytest.approx(0.011)
    assert metrics["cores_ceiling_examples_per_s"] == pytest.approx(2 / 0.014)
    assert "cores_ceiling_examples_per_s" not in Ceilings.from_blocks([100.0], [50.0], [5.0]).metrics()


def test_recommendation_when_the_pipeline_is_already_tuned():
    text = recommend(
        figures_with_input_wait(0.005, 0.005),
        PipelineKnobs(
            prefetch="autotune",
            map_parallelism="autotune",
            cache="memory",
            transfer_dtype="uint8",
            num_parallel_reads="autotune",
        ),
    )
    assert text.startswith("highly input-bound: 50 % of step time")
    assert "pipeline=tuned" not in text and "knobs are on" in text


def test_recommendation_for_a_compute_bound_run_suggests_compute_knobs():
    # 0.1 ms of a 10 ms step waiting: 1 %, not input-bound.
    text = recommend(
        figures_with_input_wait(0.0001, 0.0099),
        PipelineKnobs(prefetch=0, map_parallelism=1, cache="off", transfer_dtype="float32"),
        compute_ceiling_examples_per_s=3300.0,
    )
    assert text.startswith(
        "compute-bound: 1 % of step time waits for input at 3,200 examples/s (compute alone 3,300 examples/s)."
    )
    assert "strategy=mirrored" in text and "train.global_batch_size" in text and "mixed_float16" in text
    assert "prefetch" not in text  # input knobs are not the bottleneck here


# ---- Input stall vs host overhead ---------------------------------------------------------------

from bwopt.measure import HostReferences, bottleneck_verdict  # noqa: E402


def test_the_wait_splits_into_stall_beyond_a_ready_fetch_and_host_overhead():
    # Four 1 ms steps: waits of 0.1 ms (a ready batch) and 0.6 ms (0.5 ms late); fetch 0.1, dispatch 0.05.
    timer = StepTimer([0.1e-3, 0.6e-3, 0.1e-3, 0.6e-3], [0.9e-3, 0.4e-3, 0.9e-3, 0.4e-3])
    references = HostReferences(dispatch_overhead_s=0.05e-3, fetch_overhead_s=0.1e-3)
    figures = timing_figures(timer, StepPlan(1, 4, 0), 10, 10, references)
    assert figures.input_wait_fraction == pytest.approx(0.35)
    assert figures.input_stall_fraction == pytest.approx(1.0e-3 / 4e-3)
    assert figures.host_overhead_fraction == pytest.approx(4 * 0.15e-3 / 4e-3)
    assert figures.verdict == "highly input-bound" and figures.input_bound_verdict == "highly input-bound"
    assert {"input_stall_fraction", "fetch_overhead_s"} <= set(figures.metrics())
    assert "ready_execution_s" not in figures.metrics()  # not measured: no metric


def test_with_steps_per_execution_the_stall_is_time_beyond_a_ready_execution():
    # Executions of 4 steps; ready ones take 2 ms; two took 2 ms, two 3 ms: 2 ms of stall in 10 ms.
    timer = StepTimer([0.0] * 4, [2e-3, 3e-3, 2e-3, 3e-3])
    references = HostReferences(dispatch_overhead_s=0.1e-3, ready_execution_s=2e-3)
    figures = timing_figures(timer, StepPlan(1, 4, 0, steps_per_execution=4), 10, 10, references)
    assert figures.num_timed_steps == 16 and figures.throughput_examples_per_s == pytest.approx(160 / 10e-3)
    assert figures.step_time_p50_s == pytest.approx(2.5e-3 / 4)
    assert figures.input_stall_fraction == pytest.approx(0.2)
    assert figures.host_overhead_fraction == pytest.approx(0.04)
    assert figures.verdict == "highly input-bound"


def test_a_reference_whose_blocks_spread_widens_the_partition_and_the_verdict_waits_for_it():
    """No stall at all: 300 executions of 10 ms (±1 %) on ready batches, timed against a reference
    whose median block read 6 % low. Resampling the executions cannot see that error; the
    reference's blocks (9.4-10.2 ms) can: the stall's interval reaches 0 and the verdict is not
    "moderately input-bound"."""
    rng = np.random.default_rng(0)
    timer = StepTimer([0.0] * 300, list(0.010 * (1 + 0.01 * rng.standard_normal(300))))
    plan = StepPlan(1, 300, 0, steps_per_execution=10)
    bare = HostReferences(dispatch_overhead_s=0.1e-3, ready_execution_s=0.0094)
    ranged = replace(bare, ranges={"ready_execution_s": (0.0094, 0.0102), "dispatch_overhead_s": (0.09e-3, 0.12e-3)})
    narrow, wide = (timing_figures(timer, plan, 10, 10, references) for references in (bare, ranged))
    assert narrow.input_stall_fraction == wide.input_stall_fraction == pytest.approx(0.06, abs=0.005)
    assert narrow.input_stall_fraction_ci95[0] > 0.05 and narrow.verdict == "moderately input-bound"  # overconfident
    assert wide.input_stall_fraction_ci95[0] == 0 and wide.verdict.startswith("mixed")
    low, high = wide.host_overhead_fraction_ci95
    assert low < 0.0092 and high > 0.0118  # the dispatch range (0.09-0.12 ms of ~10 ms) too


def test_the_references_ranges_travel_with_them_among_a_modes_figures():
    references = HostReferences(0.1e-3, ready_execution_s=2e-3, ranges={"ready_execution_s": (1.9e-3, 2.2e-3)})
    figures = {**references.metrics(), "compute_ceiling_examples_per_s": 5.0}
    assert figures["ready_execution_s_ci95_low"] == 1.9e-3 and figures["ready_execution_s_ci95_high"] == 2.2e-3
    found, rest = HostReferences.split_from(figures)
    assert found == references and rest == {"compute_ceiling_examples_per_s": 5.0}
    assert references.at(0).ready_execution_s == 1.9e-3 and references.at(1).ready_execution_s == 2.2e-3
    assert references.at(1).dispatch_overhead_s == 0.1e-3  # no range: where it is


@pytest.mark.parametrize(
    "stall,host,verdict",
    [
        (0.25, 0.10, "highly input-bound"),
        (0.25, 0.20, "input- and host-overhead-bound"),
        (0.21, 0.38, "input- and host-overhead-bound"),  # both large: both, whichever is larger
        (0.10, 0.30, "host-overhead-bound"),
        (0.10, 0.10, "moderately input-bound"),
        (0.01, 0.19, "compute-bound"),
    ],
)
def test_bottleneck_verdict(stall, host, verdict):
    assert bottleneck_verdict(stall, host) == verdict


def test_host_overhead_bound_runs_are_told_to_fuse_steps():
    timer = StepTimer([0.1e-3] * 4, [0.3e-3] * 4)
    figures = timing_figures(timer, StepPlan(1, 4, 0), 10, 10, HostReferences(0.1e-3, fetch_overhead_s=0.1e-3))
    assert figures.verdict == "host-overhead-bound"
    advice = recommend(figures, PipelineKnobs(prefetch=2, map_parallelism=2, cache="memory", transfer_dtype="uint8"))
    assert advice.startswith("host-overhead-bound") and "train.steps_per_execution=8" in advice


def test_a_run_bound_by_both_is_told_both_cures_the_larger_share_first():
    import dataclasses

    from bwopt.measure.verdicts import BOTH_BOUND

    timer = StepTimer([0.1e-3] * 4, [0.3e-3] * 4)
    figures = timing_figures(timer, StepPlan(1, 4, 0), 10, 10, HostReferences(0.1e-3, fetch_overhead_s=0.1e-3))
    knobs = PipelineKnobs(prefetch=0, map_parallelism=1, cache="off", transfer_dtype="float32")
    for stall, host, first in ((0.30, 0.22, "pipeline=tuned"), (0.22, 0.30, "train.steps_per_execution=8")):
        both = dataclasses.replace(figures, verdict=BOTH_BOUND, input_stall_fraction=stall, host_overhead_fraction=host)
        advice = recommend(both, knobs)
        assert advice.startswith(f"{BOTH_BOUND}: input stall {stall * 100:.0f} %, host overhead {host * 100:.0f} %")
        assert "pipeline=tuned" in advice and "train.steps_per_execution=8" in advice
        assert advice.index(first) == min(advice.index("pipeline=tuned"), advice.index("train.steps_per_execution=8"))
        assert "try set" not in advice  # a list of settings to try, not of sentences
    mixed = dataclasses.replace(figures, verdict="mixed: …", input_stall_fraction=0.18, host_overhead_fraction=0.4)
    tries = "Try train.steps_per_execution=8 (host overhead), then pipeline=tuned (input stall)"
    assert recommend(mixed, knobs).endswith(tries)


def test_ceilings_keep_the_median_and_spread_of_their_blocks():
    ceilings = Ceilings.from_blocks([90.0, 100.0, 110.0], [40.0, 50.0, 45.0], [4.0, 5.0, 4.5])
    assert ceilings.compute_examples_per_s == 100.0 and ceilings.compute_spread == pytest.approx(0.1)
    assert ceilings.input_examples_per_s == 45.0 and ceilings.input_spread == pytest.approx(5 / 45)
    from bwopt.measure import efficiency_spread

    assert efficiency_spread(0.9, ceilings.metrics()) == pytest.approx(0.9 * 5 / 45)  # input is the lower


@pytest.mark.parametrize("spread", [None, 0.0, 0.05, 0.3])
def test_efficiency_is_never_printed_above_100_percent_without_its_spread(spread, monkeypatch):
    import re

    monkeypatch.setenv("COLUMNS", "200")  # the row on one line, whatever the terminal

    from bwopt.terminal import figures_table

    figures = {"efficiency": 1.165, **({} if spread is None else {"efficiency_spread": spread})}
    row = next(line for line in figures_table(figures).splitlines() if "efficiency" in line)
    for match in re.finditer(r"(\d+(?:\.\d+)?)%", row):
        if float(match.group(1)) > 100:
            assert f"± {spread:.1%}" in row
    if spread == 0.3:
        assert "116.5% ± 30.0%" in row and "within noise" in row
    if spread is None:
        assert "116.5" not in row and "noise" in row


# The artificial source (conf/data/artificial.yaml): a source that sleeps per element and a step that
# sleeps on top of a tiny model, so the right verdict is known in advance.
KNOWN = [
    "data=artificial",
    "split=uniform",
    "pipeline=naive",
    "pipeline.shuffle_buffer=0",
    "tracking=none",
    "data.num_files=4",
    "data.examples_per_file=96",
    "train.global_batch_size=16",
    "train.epochs=1",
    "train.warmup_steps=2",
    "model.hidden_units=[8]",
    "measure.memcpy_bandwidth=false",
    "measure.progress=false",
]


@pytest.mark.slow  # ten short trainings
@pytest.mark.parametrize(
    "workload,answer",
    [
        # 16 sleeps of 1 ms per batch, no prefetch, no compute: the step waits for its batch ~all the time
        (["data.element_latency_s=0.001", "data.step_compute_s=0"], "highly input-bound"),
        # batches ready at once, behind a prefetch buffer, a step of 80 ms: the step's own work (a
        # ready batch's next() still costs ~1 ms on a busy machine: at 40 ms steps that is a stall
        # of 2-3 %, whose interval can reach the 5 % threshold)
        (["data.element_latency_s=0", "data.step_compute_s=0.08", "pipeline.prefetch=8"], "compute-bound"),
    ],
)
@pytest.mark.timing
def test_five_identical_runs_give_one_verdict(run_experiment, workload, answer):
    """A verdict is only given where its interval clears the thresholds, so identical runs agree;
    on a known workload they give the known answer."""
    verdicts = [run_experiment(*KNOWN, *workload).figures.verdict for _ in range(5)]
    known_answer(verdicts == [answer] * 5, f"verdicts {verdicts}")


def named_sides(figures) -> dict:
    """(share, threshold) -> "above" or "below" for each verdict threshold the run's interval clears."""
    from bwopt.measure.verdicts import HIGHLY_INPUT_BOUND, HOST_OVERHEAD_BOUND, MODERATELY_INPUT_BOUND

    intervals = {
        "input stall": figures.input_stall_fraction_ci95 or figures.input_wait_fraction_ci95,
        "host overhead": figures.host_overhead_fraction_ci95,
    }
    thresholds = {"input stall": (MODERATELY_INPUT_BOUND, HIGHLY_INPUT_BOUND), "host overhead": (HOST_OVERHEAD_BOUND,)}
    sides = {}
    for share, bounds in intervals.items():
        for threshold in thresholds[share] if bounds else ():
            if bounds[0] >= threshold:
                sides[share, threshold] = "above"
            elif bounds[1] < threshold:
                sides[share, threshold] = "below"
    return sides


def contradictions(runs) -> list:
    """The thresholds one run's interval puts a share above and another's below."""
    named = {}
    for figures in runs:
        for key, side in named_sides(figures).items():
            named.setdefault(key, set()).add(side)
    return [f"{share} at {threshold:.0%}" for (share, threshold), sides in named.items() if len(sides) > 1]


def test_runs_contradict_where_one_interval_clears_a_threshold_above_and_another_below():
    from types import SimpleNamespace

    def figures(stall, host):
        return SimpleNamespace(
            input_stall_fraction_ci95=stall, input_wait_fraction_ci95=None, host_overhead_fraction_ci95=host
        )

    # Before the shares' intervals held their windows' scatter, five default runs on one machine read
    # "host-overhead-bound" (stall 16-18 %) and "input- and host-overhead-bound" (stall 22-24 %).
    below, above = figures([0.16, 0.18], [0.43, 0.47]), figures([0.22, 0.24], [0.36, 0.39])
    assert contradictions([below, above]) == ["input stall at 20%"]
    straddling = figures([0.17, 0.23], [0.36, 0.46])  # "mixed": says neither
    assert contradictions([below, straddling]) == contradictions([straddling, above]) == []
    low_stall, moderate_stall = figures([0.01, 0.04], [0.1, 0.3]), figures([0.06, 0.1], [0.1, 0.3])
    assert contradictions([low_stall, moderate_stall]) == ["input stall at 5%"]


@pytest.mark.timing
@pytest.mark.slow  # five runs of the default experiment, each with its 3 s window
def test_five_identical_default_runs_never_contradict_each_other(run_experiment):
    """The default run as shipped (its timed window included), five times: no threshold has one run's
    interval wholly above it and another's wholly below. Where a share sits at a threshold (the
    stall near 20 % on some machines) a run says "mixed" rather than a side."""
    from omegaconf import OmegaConf

    from bwopt.app import config_dir

    window = OmegaConf.load(f"{config_dir()}/config.yaml").measure.min_timed_s
    quiet = ["tracking=none", "measure.memcpy_bandwidth=false", "measure.progress=false", "measure.plots=false"]
    runs = [run_experiment(*quiet, f"measure.min_timed_s={window}").figures for _ in range(5)]
    verdicts = [figures.verdict for figures in runs]
    found = contradictions(runs)
    known_answer(found == [], f"verdicts {verdicts} contradict on {found}")


def test_the_cores_row_names_both_cpu_costs_and_says_when_every_core_is_busy():
    from bwopt.terminal import figures_table

    figures = {
        "compute_ceiling_examples_per_s": 100_000.0,
        "input_ceiling_examples_per_s": 29_000.0,
        "compute_cpu_s_per_example": 0.00002,
        "input_cpu_s_per_example": 0.00006,
        "cores_ceiling_examples_per_s": 25_000.0,  # 2 cores / 0.08 ms
    }
    for throughput, busy in ((24_000.0, True), (12_000.0, False)):
        measured = {"throughput_examples_per_s": throughput, "cores_efficiency": throughput / 25e3}
        table = figures_table({**figures, **measured})
        row = " ".join(table.split("cores", 1)[1].split("efficiency")[0].split())
        assert row.startswith("step 0.0200 + input 0.0600 CPU-ms per example on 2 cores: about 25,000.0 examples/s")
        assert f"training {throughput / 25e3:.0%} of it" in row
        assert ("every core busy" in row) == busy
    # A step that keeps 1.6 cores busy alone holds 2 for its 0.0125 ms per example: 0.0250 of them.
    spans = {
        **figures,
        "compute_ceiling_examples_per_s": 80_000.0,
        "step_cores": 2,
        "cores_ceiling_examples_per_s": 23_529.4,
    }
    row = " ".join(figures_table(spans).split("cores", 1)[1].split("efficiency")[0].split())
    assert row.startswith(
        "step 0.0200 (it holds 2 cores for its 0.0125 ms: 0.0250) + input 0.0600 CPU-ms per example on 2 cores"
    )
    one = {**figures, "compute_ceiling_examples_per_s": 80_000.0, "step_cores": 1}
    assert "holds" not in figures_table(one)


def test_the_cpu_row_gives_the_cores_kept_busy_with_its_interval_and_the_cpu_per_example():
    from bwopt.terminal import figure_rows
    from bwopt.tracking import readable_metrics

    figures = {"cores_busy": 1.934, "cores_busy_ci95": [1.90, 1.95], "cpu_s_per_example": 0.0000271}
    rows = dict(figure_rows({**figures, "cores_available": 2.0}))
    assert rows["cpu"] == "1.93 cores busy (95 % CI 1.90–1.95) of 2 available, 0.0271 CPU-ms per example"
    assert dict(figure_rows(figures))["cpu"] == "1.93 cores busy (95 % CI 1.90–1.95), 0.0271 CPU-ms per example"
    assert "cpu" not in dict(figure_rows({"cores_busy": None}))
    assert readable_metrics({"cpu_s_per_example": 2e-5}) == {"cpu_ms_per_example": pytest.approx(0.02)}


def test_the_efficiencys_spread_is_logged_in_the_efficiencys_unit():
    from bwopt.tracking import readable_metrics

    logged = readable_metrics({"efficiency": 0.95, "efficiency_spread": 0.03})
    assert logged == {"efficiency_pct": pytest.approx(95.0), "efficiency_spread_pct": pytest.approx(3.0)}


def test_overlapping_steps_carry_their_throughputs_interval_to_the_span_they_took():
    """Asynchronous steps' throughput is over the wall time they spanned: its interval moves with it."""
    from bwopt.measure.overlap import ASYNC_WALL_KEY, overlapping_steps_figures

    timer = StepTimer([0.001] * 40, [0.009 + 0.0005 * (index % 3) for index in range(40)])
    figures = timing_figures(timer, StepPlan(1, 40, 0), 10, 100)
    spanned = overlapping_steps_figures(figures, {ASYNC_WALL_KEY: figures.timed_wall_s / 4})
    assert spanned.throughput_examples_per_s == pytest.approx(4 * figures.throughput_examples_per_s)
    low, high = spanned.throughput_examples_per_s_ci95
    assert low < spanned.throughput_examples_per_s < high
    assert [low, high] == pytest.approx([4 * bound for bound in figures.throughput_examples_per_s_ci95])
