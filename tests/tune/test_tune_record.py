"""tune's record of its trials: the path plot, from trials built by hand (no TensorFlow, no process)."""

import math
import re
from dataclasses import replace

import pytest

from bwopt.sweep.tune_plot import plot_path
from bwopt.sweep.tune_record import Trial


def test_the_path_plots_a_one_block_interval_a_rounding_step_above_its_throughput(tmp_path):
    """A run of few timed steps has one block: its interval is its throughput, recomputed, and can
    sit one rounding step above it (2434.5321187167046 for 2434.532118716705, seen in a trial)."""
    start = Trial(0, "start", "the workload as given", {}, 2434.532118716705, [2434.5321187167046] * 2, kept=True)
    reverted = Trial(1, "prefetch", "…", {"pipeline.prefetch": "3"}, 2087.5764780647596, [2087.5764780647596] * 2)
    measured = Trial(2, "vectorize", "…", {"pipeline.vectorized_map": "true"}, 5000.0, [4000.0, 6000.0], 9000.0, 7000.0)
    path = plot_path([start, reverted, measured], tmp_path / "tune_path.png")
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_trial_is_measured_against_its_lowest_ceiling_the_cores_one_included():
    from bwopt.sweep.tune_text import closing_line, table

    start = Trial(0, "start", "the workload as given", {}, 5000.0, [4900.0, 5100.0], 100_000.0, 6000.0, kept=True)
    shared = Trial(1, "vectorize", "…", {"pipeline.vectorized_map": "true"}, 22_000.0, [21_000.0, 23_000.0])
    shared.compute_ceiling, shared.input_ceiling, shared.cores_ceiling = 100_000.0, 29_000.0, 24_000.0
    shared.kept = True
    assert (start.ceiling_name, start.ceiling) == ("input ceiling", 6000.0)  # no cores ceiling measured
    assert (shared.ceiling_name, shared.ceiling) == ("cores ceiling", 24_000.0)
    assert "0.92 (cores ceiling)" in table([start, shared])
    assert ", 0.92 of the cores ceiling, 2 runs" in closing_line(start, shared, 2, 60.0)


def test_with_every_core_busy_tune_does_not_try_more_threads_or_overlap_but_still_tries_less_cpu():
    from bwopt.sweep.tune_plan import busy_cores_reason

    busy = Trial(1, "parallelize", "…", {}, 22_000.0, [21_000.0, 23_000.0], 100_000.0, 29_000.0)
    busy.cores_ceiling = 24_000.0  # 0.92 of it, below the input and compute ceilings
    reason = busy_cores_reason("prefetch", busy)
    assert reason.startswith("every core busy: trial 1 runs at 0.92 of its cores ceiling (24,000 examples/s)")
    assert busy_cores_reason("parallelize", busy)
    for less_cpu in ("cache", "vectorize", "transfer uint8", "amortise host"):
        assert busy_cores_reason(less_cpu, busy) is None
    idle = Trial(1, "vectorize", "…", {}, 12_000.0, [11_000.0, 13_000.0], 100_000.0, 29_000.0)
    idle.cores_ceiling = 24_000.0  # half of it: threads may help
    assert busy_cores_reason("prefetch", idle) is None
    above = Trial(1, "vectorize", "…", {}, 5_000.0, [4_900.0, 5_100.0], 100_000.0, 5_200.0)
    above.cores_ceiling = 7_000.0  # the input ceiling is the limit, not the cores
    assert busy_cores_reason("parallelize", above) is None
    # Measured, the cores the incumbent's training kept busy decide: the estimate alone is not enough.
    busy.cores_busy, busy.cores_available = 1.95, 2.0
    assert "(24,000 examples/s, 1.95 cores busy)" in busy_cores_reason("prefetch", busy)
    busy.cores_busy = 1.40  # 70 % of 2 cores: the estimate said busy, the clock says not
    assert busy_cores_reason("prefetch", busy) is None


def test_a_step_that_spans_the_cores_holds_them_idle_between_its_ops_and_tune_counts_them_busy():
    """MobileNetV2 at 64x64 on 2 cores (experiment=imagenet_like pipeline=naive, measured): 275
    examples/s, 1.69 cores busy, the step alone 310 examples/s at 5.62 CPU-ms per example (1.74
    cores), so it holds both for 3.23 ms per example, 0.83 ms of it idle: at 275 examples/s
    0.23 cores more are held, 1.92 in all, and more threads or overlap are not tried."""
    from bwopt.sweep.tune_plan import busy_cores_reason

    start = Trial(0, "start", "the workload as given", {}, 275.0, [269.0, 281.0], 310.0, 2180.0)
    start.cores_ceiling, start.cores_busy, start.cores_available = 286.0, 1.69, 2.0
    assert start.cores_held == 1.69  # the step's cores not measured: those kept busy
    start.step_cores, start.compute_cpu_s_per_example = 2, 0.00562
    assert start.cores_held == pytest.approx(1.69 + (2 / 310 - 0.00562) * 275)
    assert start.cores_held == pytest.approx(1.92, abs=0.01)
    reason = busy_cores_reason("prefetch", start)
    assert "1.69 cores busy, 1.92 held by training with the step's idle share" in reason
    start.step_cores = 1  # a step on one core leaves the other free: the clock decides as before
    assert start.cores_held == 1.69
    assert busy_cores_reason("prefetch", start) is None


def test_a_trial_reads_the_cores_its_training_kept_busy_from_its_summary(tmp_path):
    import json

    from bwopt.sweep.tune_record import read_trial

    summary = {
        "status": "FINISHED",
        "run_id": None,
        "figures": {"throughput_examples_per_s": 22_000.0, "cores_busy": 1.93},
        "measurements": {
            "cores_ceiling_examples_per_s": 24_000.0,
            "cores_available": 2.0,
            "step_cores": 2,
            "compute_cpu_s_per_example": 1.5e-5,
        },
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    trial = read_trial(tmp_path, Trial(1, "prefetch", "…", {}))
    assert (trial.cores_busy, trial.cores_available, trial.cores_ceiling) == (1.93, 2.0, 24_000.0)
    assert (trial.step_cores, trial.compute_cpu_s_per_example) == (2, 1.5e-5)


def repeated(number: int, runs) -> Trial:
    """A trial whose finished repeats measured `runs`: (examples/s, its run's interval) each."""
    trial = Trial(number, "start" if number == 0 else "prefetch", "…", {}, runs[0][0], runs[0][1])
    trial.repeats = list(runs)
    return trial


def test_a_within_run_win_that_repeats_scatter_is_not_called_faster():
    from bwopt.sweep.tune_record import against, run_to_run_spread

    # Each run is sure of itself to 1 %, but the same settings read 100 and 108 from one run to the next.
    start = repeated(0, [(100.0, [99.0, 101.0]), (108.0, [107.0, 109.0])])
    candidate = repeated(1, [(104.0, [103.0, 105.0]), (112.0, [111.0, 113.0])])
    first_runs = [repeated(trial.number, trial.repeats[:1]) for trial in (candidate, start)]
    assert against(*first_runs).word == "faster"  # what one run per trial would have claimed
    pooled = run_to_run_spread([start, candidate])
    assert pooled[1] == 2  # one degree of freedom per trial of two repeats
    comparison = against(candidate, start, pooled)
    assert comparison.word == "no difference detected" and comparison.ci95[0] < 1 < comparison.ci95[1]
    # Repeats that agree resolve the same 10 %.
    steady = repeated(0, [(100.0, [99.0, 101.0]), (100.4, [99.4, 101.4])])
    faster = repeated(1, [(110.0, [109.0, 111.0]), (110.3, [109.3, 111.3])])
    assert against(faster, steady, run_to_run_spread([steady, faster])).word == "faster"


def test_a_trial_reads_every_repeat_and_leaves_out_one_that_did_not_finish(tmp_path):
    import json

    from bwopt.sweep.tune_record import pool_intervals, read_repeats
    from bwopt.sweep.tune_text import noise_sentence

    def job(folder: str, throughput: float, ceiling: float):
        summary = {
            "status": "FINISHED",
            "run_id": None,
            "figures": {
                "throughput_examples_per_s": throughput,
                "throughput_examples_per_s_ci95": [throughput * 0.99, throughput * 1.01],
            },
            "measurements": {"compute_ceiling_examples_per_s": ceiling},
        }
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "summary.json").write_text(json.dumps(summary))
        return tmp_path / folder

    folders = [job("4", 900.0, 2000.0), tmp_path / "5", job("6", 1000.0, 2100.0)]  # 5 never wrote one
    trial = read_repeats(folders, Trial(2, "prefetch", "…", {"pipeline.prefetch": "3"}))
    assert trial.repeats == [(900.0, [891.0, 909.0]), (1000.0, [990.0, 1010.0])]
    assert (trial.throughput, trial.compute_ceiling) == (950.0, 2050.0)  # the medians of the two
    low, high = trial.ci95  # the interval of the two repeats' mean, wider than either run's
    assert low < 891.0 and high > 1010.0 and math.isclose(math.sqrt(low * high), math.sqrt(900.0 * 1000.0))
    # Drawn with a spread pooled over more trials (more degrees of freedom), as it was compared, it narrows.
    pool_intervals([trial], (0.0745, 6))
    assert low < trial.ci95[0] < 891.0 and 1010.0 < trial.ci95[1] < high
    assert "each trial ran once" in noise_sentence(1, None) and "hydra.sweeper.repeats=2" in noise_sentence(1, None)
    assert "no trial finished two runs" in noise_sentence(2, None)
    assert "ran 3 times" in noise_sentence(3, (0.021, 4)) and "2.1 %" in noise_sentence(3, (0.021, 4))
    assert "is not in it" in noise_sentence(2, (0.021, 4))  # without the incumbent's runs beside
    beside = noise_sentence(2, (0.021, 4), drift=(0.034, 3))
    assert "incumbent as often beside each candidate" in beside and "drift" in beside and "3.4 % (3 degrees" in beside
    assert "leans on the runs of both in the same rounds" in beside
    assert "leans on" not in noise_sentence(2, (0.021, 4), drift=(0.0, 3))  # no drift: the plain means


def test_drift_measured_from_the_incumbents_runs_beside_later_candidates_enters_the_comparison():
    """The machine speeds up by 20 % before the last candidate, which changes nothing. The start
    was run beside three earlier candidates too, all in the slow minutes, so its runs agree and
    its mean sits back in time: against them alone the candidate reads faster beyond their
    spread. The start's run between the candidate's two reads the new speed: its block means then
    scatter beyond what the repeats' spread explains, and that drift, in the comparison, leaves
    the same candidate undecided."""
    from bwopt.sweep.tune_record import against, drift_spread, run_to_run_spread

    start = repeated(0, [(1000.0, [995.0, 1005.0]), (1004.0, [999.0, 1009.0])])
    start.repeats += [(1001.0, [996.0, 1006.0]), (1002.0, [997.0, 1007.0]), (1003.0, [998.0, 1008.0])]
    start.repeat_blocks = [0, 0, 1, 2, 3]
    reverted = [repeated(n, [(1001.0, [996.0, 1006.0]), (1003.0, [998.0, 1008.0])]) for n in (1, 2, 3)]
    candidate = repeated(4, [(1200.0, [1194.0, 1206.0]), (1203.0, [1197.0, 1209.0])])
    trials = [start, *reverted, candidate]
    pooled = run_to_run_spread(trials)
    assert pooled[1] == 5  # one degree of freedom per trial's two repeats; a run beside adds none
    assert drift_spread(trials, pooled)[0] < 0.001  # no drift yet: the start's blocks agree
    assert against(candidate, start, pooled, drift_spread(trials, pooled)).word == "faster"
    start.repeats.append((1198.0, [1192.0, 1204.0]))  # its run between the candidate's
    start.repeat_blocks.append(4)
    drift = drift_spread(trials, pooled)
    assert drift[1] == 4 and drift[0] > 0.05  # five blocks of the start's
    assert against(candidate, start, pooled).word == "faster"  # what the repeats' spread alone says
    comparison = against(candidate, start, pooled, drift)
    assert comparison.word == "no difference detected", comparison


def test_without_drift_the_incumbents_runs_beside_later_candidates_keep_a_large_gain_resolved():
    """Runs that scatter by ~25 % from one to the next, as tune's fresh processes did here, and no
    drift between blocks: a x2.3 candidate is resolved against every run of the start (five), as it
    would not be against the one run beside it."""
    from bwopt.sweep.tune_record import against, drift_spread, run_to_run_spread

    start = repeated(0, [(5000.0, None), (8000.0, None), (6500.0, None), (5200.0, None), (7600.0, None)])
    start.repeat_blocks = [0, 0, 1, 2, 3]
    candidate = repeated(1, [(12_000.0, None), (19_000.0, None)])
    others = [repeated(n, [(6000.0, None), (8500.0, None)]) for n in (2, 3)]
    trials = [start, candidate, *others]
    pooled = run_to_run_spread(trials)
    drift = drift_spread(trials, pooled)
    assert drift[0] == 0.0  # the block means scatter no more than the repeats do
    comparison = against(candidate, start, pooled, drift)
    assert comparison.word == "faster" and comparison.ratio == pytest.approx(2.3, rel=0.1)
    beside = replace(start, repeats=start.repeats[2:3], repeat_blocks=[1])
    assert against(candidate, beside, pooled, drift).word == "no difference detected"


def test_a_setting_that_scatters_more_than_the_pool_is_judged_by_its_own_spread_and_reads_no_drift():
    """A noisy incumbent (its two runs in each of three rounds 20 % apart in log, their round means
    as close as that noise allows) beside six quiet candidates (1 % apart): its own spread,
    moderated toward the pool's by two degrees of freedom, is what its runs scatter by, and its
    rounds do not read as a drifting machine, though they scatter beyond what the pool explains."""
    from bwopt.sweep.tune_record import PRIOR_DEGREES, drift_spread, run_to_run_spread, setting_spread

    def runs(centre: float, half: float):
        return [(math.exp(centre - half), None), (math.exp(centre + half), None)]

    start = repeated(0, [*runs(9.0, 0.1), *runs(9.1, 0.1), *runs(8.95, 0.1)])
    start.repeat_blocks = [0, 0, 1, 1, 2, 2]
    quiet = [repeated(n, runs(9.0, 0.005)) for n in range(1, 7)]
    trials = [start, *quiet]
    pooled = run_to_run_spread(trials)
    # within each block: two runs 0.2 apart give 0.02 of squares, one degree of freedom
    assert pooled[1] == 9 and pooled[0] == pytest.approx(math.sqrt((3 * 0.02 + 6 * 0.00005) / 9))
    own = setting_spread(start, pooled)
    moderated = (3 * 0.02 + PRIOR_DEGREES * pooled[0] ** 2) / (3 + PRIOR_DEGREES)
    assert own == (pytest.approx(math.sqrt(moderated)), 3 + PRIOR_DEGREES) and own[0] > pooled[0]
    # quieter than the pool: the pool's spread, never less, but as sure as its own two runs and the
    # prior make it (one degree of freedom and two), not as the nine of the whole pool
    assert setting_spread(quiet[0], pooled) == (pooled[0], 1 + PRIOR_DEGREES)
    assert setting_spread(start, None) is None
    # the round means (9.0, 9.1, 8.95): a between-round mean square of two runs each above the
    # pool's variance (it would read as drift), below the incumbent's own
    means = [9.0, 9.1, 8.95]
    between = 2 * sum((mean - sum(means) / 3) ** 2 for mean in means) / 2
    assert pooled[0] ** 2 < between < own[0] ** 2
    assert drift_spread(trials, pooled)[0] == 0.0


def test_each_runs_time_in_slow_episodes_is_read_and_said_per_trial(tmp_path):
    import json

    from bwopt.sweep.tune_record import read_repeats
    from bwopt.sweep.tune_text import slow_sentence

    def job(folder: str, throughput: float, slow):
        figures = {"throughput_examples_per_s": throughput, "slow_time_fraction": slow}
        (tmp_path / folder).mkdir()
        summary = {"status": "FINISHED", "run_id": None, "figures": figures, "measurements": {}}
        (tmp_path / folder / "summary.json").write_text(json.dumps(summary))
        return tmp_path / folder

    start = read_repeats([job("0", 700.0, 0.31), job("1", 1000.0, 0.0)], Trial(0, "start", "…", {}))
    assert start.slow_time_fractions == [0.31, 0.0]
    short = read_repeats([job("2", 1100.0, None), tmp_path / "3"], Trial(1, "prefetch", "…", {}))
    assert short.slow_time_fractions == [None]  # too short a window to tell; the run that failed is left out
    sentence = slow_sentence([start, short])
    assert "per trial: 0: 31 %, 0 %." in sentence and "1:" not in sentence
    assert slow_sentence([short]) == ""


TUNED_WORKLOADS = [
    ["experiment=pipelines", "pipeline=naive", "pipeline.vectorized_map=true", "pipeline.map_parallelism=2"],
    ["experiment=imagenet_like", "pipeline=naive", "pipeline.fused_decode_crop=false", "pipeline.cache=memory"],
    ["tracking=server/mlflow", "data=synthetic", "data.image_shape=[8,8,1]", "train.steps_per_execution=4"],
    ["model=cnn", "strategy=mirrored", "pipeline.tfrecord.enabled=true", "pipeline.prefetch=autotune"],
]


def written_experiment(folder, overrides):
    """(the file's text or None, why not) from write_experiment with Hydra's own loader on conf/."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from bwopt.app import config_dir
    from bwopt.sweep.tune_text import write_experiment

    path = folder / "experiment" / "tuned.yaml"
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        loader = GlobalHydra.instance().hydra.config_loader
        why_not = write_experiment(path, overrides, loader, "config", ["tuned: ×2.0 over the start"])
    return (path.read_text() if path.is_file() else None), why_not


@pytest.mark.parametrize("overrides", TUNED_WORKLOADS, ids=lambda overrides: overrides[0])
def test_the_tuned_overrides_as_an_experiment_config_compose_to_the_same_config(tmp_path, overrides):
    """experiment/tuned.yaml composes, as `experiment=tuned` from its folder, to what tuned.yaml's
    overrides compose to: presets, group choices (a nested one too) and values."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from bwopt.app import config_dir

    text, why_not = written_experiment(tmp_path, overrides)
    assert why_not == "" and text.startswith("# @package _global_\n# tuned: ×2.0 over the start\ndefaults:\n")
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        given = compose(config_name="config", overrides=overrides)
        search_path = f"hydra.searchpath=[file://{tmp_path}]"  # what -cd adds on the command line
        from_file = compose(config_name="config", overrides=[search_path, "experiment=tuned"])
        bare = compose(config_name="config")
    assert OmegaConf.to_container(from_file) == OmegaConf.to_container(given) != OmegaConf.to_container(bare)


@pytest.mark.parametrize(
    "override, why_not",
    [
        ("~pipeline.cache", "`~pipeline.cache` has no form in a config file"),
        ("pipeline@train=naive", "`pipeline@train=naive` has no form in a config file"),
        ("pipeline=fast", "it does not compose: .*pipeline/fast"),  # Hydra's own words follow
    ],
)
def test_an_override_a_config_file_cannot_hold_is_named_and_no_file_is_left(tmp_path, override, why_not):
    text, reason = written_experiment(tmp_path, ["experiment=pipelines", override])
    assert text is None and re.fullmatch(why_not, reason.rstrip(".'")), reason


def in_blocks(number: int, blocks) -> Trial:
    """A trial whose runs (examples/s, without an interval of their own) came in `blocks`: [[run, ...], ...]."""
    trial = repeated(number, [(value, None) for runs in blocks for value in runs])
    trial.repeat_blocks = [index for index, runs in enumerate(blocks, number * 10) for _ in runs]
    return trial


def test_the_difference_takes_welchs_degrees_of_freedom_from_the_two_sides_spreads():
    """Without drift the comparison is Welch's: the difference of the two mean logs, its variance
    each side's spread squared over its runs, its degrees of freedom Satterthwaite's for that sum
    (rounded down), the interval Student's t at that many (scipy's). A noisy candidate (two rounds
    of runs 30 % apart in log) beside a quiet incumbent (six rounds): the candidate's own spread moderated
    toward the pool, the incumbent's the pool's."""
    from scipy.stats import t as student_t

    from bwopt.sweep.tune_record import against, run_to_run_spread, setting_spread

    start = in_blocks(
        0, [[1000.0, 1010.0], [990.0, 1005.0], [1002.0, 996.0], [1008.0, 1000.0], [1000.0, 1003.0], [997.0, 1006.0]]
    )
    candidate = in_blocks(1, [[1100.0, 1100.0 * math.exp(0.3)], [1150.0, 1150.0 * math.exp(-0.3)]])
    pooled = run_to_run_spread([start, candidate])
    (noisy, noisy_degrees), (quiet, quiet_degrees) = setting_spread(candidate, pooled), setting_spread(start, pooled)
    assert noisy > pooled[0] == quiet and noisy_degrees == 2 + 2 and quiet_degrees == pooled[1] == 8
    logs = [[math.log(value) for value, _ in trial.repeats] for trial in (candidate, start)]
    parts = [noisy**2 / len(logs[0]), quiet**2 / len(logs[1])]
    degrees = math.floor(sum(parts) ** 2 / (parts[0] ** 2 / noisy_degrees + parts[1] ** 2 / quiet_degrees))
    difference = sum(logs[0]) / len(logs[0]) - sum(logs[1]) / len(logs[1])
    half = student_t.ppf(0.975, degrees) * math.sqrt(sum(parts))
    comparison = against(candidate, start, pooled)
    assert (
        degrees == 5 and comparison.ratio
    )  # neither side's 4 or 8, nor the fewest == pytest.approx(math.exp(difference))
    assert comparison.ci95 == pytest.approx((math.exp(difference - half), math.exp(difference + half)))


def test_two_sides_at_the_pools_spread_are_as_sure_as_the_fewer_runs_that_show_them_quiet():
    """Two quiet settings beside a noisy one that fills the pool: each compared at the pool's
    spread, one estimate, so the difference counts the degrees of freedom of the less sure side
    (the candidate's one round and the two prior ones: 3), not the pool's 7 nor twice anything.
    Two runs that happen to agree do not show a setting quieter than the pool says."""
    from scipy.stats import t as student_t

    from bwopt.sweep.tune_record import against, run_to_run_spread, setting_spread

    start = in_blocks(0, [[1000.0, 1010.0], [990.0, 1005.0]])
    candidate = in_blocks(1, [[1300.0, 1303.0]])
    noisy = in_blocks(2, [[900.0, 1200.0], [1250.0, 950.0], [1000.0, 1300.0], [1100.0, 800.0]])
    pooled = run_to_run_spread([start, candidate, noisy])
    assert pooled[1] == 7
    assert setting_spread(candidate, pooled) == (pooled[0], 3) and setting_spread(start, pooled) == (pooled[0], 4)
    difference = math.log(1300.0 * 1303.0) / 2 - math.log(1000.0 * 1010.0 * 990.0 * 1005.0) / 4
    half = student_t.ppf(0.975, 3) * pooled[0] * math.sqrt(1 / 2 + 1 / 4)
    comparison = against(candidate, start, pooled)
    assert comparison.ci95 == pytest.approx((math.exp(difference - half), math.exp(difference + half)))
