"""Changes that each stayed within the noise alone run again as one change (`tune_plan.together`).
The runs are job folders written by a launcher that hands back throughputs chosen in advance by
what each run changed (real trials cannot be made to land undecided on purpose), read and judged
by tune's own code."""

from pathlib import Path
from typing import Dict, List

import pytest
from planned_tuner import PlannedTuner, write_job

from bwopt.measure.uncertainty import Comparison
from bwopt.sweep.tune_decide import Proposal
from bwopt.sweep.tune_plan import together
from bwopt.sweep.tune_record import Trial

THREADS = Proposal("parallelize", {"pipeline.map_parallelism": "2"}, "two map calls", gain=1.12)
PREFETCH = Proposal("prefetch", {"pipeline.prefetch": "3"}, "three batches in flight", gain=1.10)
CACHE = Proposal("cache", {"pipeline.cache": "memory"}, "deterministic stages", gain=1.5)


class ByChangeLauncher:
    """Each run's throughput is the next scripted for the changes it ran: "start", "parallelize",
    "prefetch", "cache" or several joined by "+" (in THREADS, PREFETCH, CACHE order)."""

    def __init__(self, sweep_dir: Path, script: Dict[str, List[float]], ceiling=None) -> None:
        self.sweep_dir, self.script, self.launched = sweep_dir, {k: list(v) for k, v in script.items()}, []
        self.measurements = {"compute_ceiling_examples_per_s": ceiling} if ceiling else {}

    def launch(self, job_overrides, initial_job_idx: int):
        (overrides,) = job_overrides
        changes = (THREADS, PREFETCH, CACHE)
        ran = [p.name for p in changes if all(f"{k}={v}" in overrides for k, v in p.overrides.items())]
        who = "+".join(ran) or "start"
        throughput = self.script[who].pop(0)
        figures = {
            "throughput_examples_per_s": throughput,
            "throughput_examples_per_s_ci95": [throughput * 0.99, throughput * 1.01],
        }
        write_job(self.sweep_dir, initial_job_idx, overrides, figures, self.measurements)
        self.launched.append(who)
        return []


def tuning(tmp_path: Path, proposals, script: Dict[str, List[float]], ceiling=None):
    tuner = PlannedTuner(max_trials=5, repeats=2, rerun_incumbent=True, extra_rounds=0)
    tuner.proposals = proposals
    tuner.sweep_dir, tuner.probe_file = tmp_path, tmp_path / "tune_probe_start.json"
    tuner.launcher = ByChangeLauncher(tmp_path, script, ceiling)
    return tuner, tuner.sweep([])


# its two runs, then two beside each later candidate
START = [1000.0, 1100.0, 1050.0, 1030.0, 980.0, 1010.0, 1070.0, 1040.0]
ALONE = [1060.0, 1140.0]  # ~×1.07 each: within two runs' noise at a spread of ~7 %


def test_two_changes_each_within_the_noise_alone_are_kept_when_together_they_clear_it(tmp_path):
    script = {"start": START, "parallelize": ALONE, "prefetch": ALONE, "parallelize+prefetch": [1400.0, 1460.0]}
    tuner, result = tuning(tmp_path, (THREADS, PREFETCH), script)
    start, threads, prefetch, both = tuner.trials
    assert not threads.kept and not prefetch.kept and threads.undecided and prefetch.undecided
    assert tuner.launcher.launched[-4:] == ["parallelize+prefetch", "start", "start", "parallelize+prefetch"]
    assert both.change == "parallelize + prefetch" and both.kept
    assert both.overrides == {"pipeline.map_parallelism": "2", "pipeline.prefetch": "3"} == result["tuned"]
    assert both.against_incumbent.word == "faster" and both.predicted_gain == pytest.approx(1.12 * 1.10)
    assert "each alone within the noise (parallelize ×1.0" in both.reason and "(trial 2)" in both.reason
    report = (tmp_path / "tune.md").read_text()
    assert "parallelize + prefetch: `pipeline.map_parallelism=2`, `pipeline.prefetch=3`" in report
    assert "Stopped: no proposal left" in report


def test_changes_that_together_still_sit_in_the_noise_are_reverted_once(tmp_path):
    script = {"start": START, "parallelize": ALONE, "prefetch": ALONE, "parallelize+prefetch": [1070.0, 1130.0]}
    tuner, result = tuning(tmp_path, (THREADS, PREFETCH), script)
    assert [trial.change for trial in tuner.trials] == ["start", "parallelize", "prefetch", "parallelize + prefetch"]
    assert result["tuned"] == {} and not tuner.trials[-1].kept
    assert "no difference detected; reverted" in tuner.trials[-1].note


def test_a_change_found_slower_or_kept_is_not_run_again_with_another(tmp_path):
    # parallelize is slower beyond the noise, cache faster: only prefetch was undecided, nothing to pair
    script = {"start": START, "parallelize": [700.0, 720.0], "cache": [1500.0, 1560.0, 1530.0, 1545.0]}
    script["prefetch+cache"] = [1560.0, 1650.0]  # prefetch runs on top of the kept cache
    tuner, result = tuning(tmp_path, (THREADS, CACHE, PREFETCH), script)
    changes = [trial.change for trial in tuner.trials]
    assert changes == ["start", "parallelize", "cache", "prefetch"], changes
    assert tuner.trials[1].against_incumbent.word == "slower" and not tuner.trials[1].undecided
    assert tuner.trials[3].undecided and result["tuned"] == {"pipeline.cache": "memory"}


def test_changes_undecided_alone_are_not_run_together_once_a_kept_change_reaches_the_target(tmp_path):
    # the cache, kept, runs at 0.94 of the compute ceiling (1,700 examples/s): past the 0.9 target
    script = {"start": START, "parallelize": ALONE, "prefetch": ALONE, "cache": [1580.0, 1620.0]}
    tuner, result = tuning(tmp_path, (THREADS, PREFETCH, CACHE), script, ceiling=1700.0)
    assert [trial.change for trial in tuner.trials] == ["start", "parallelize", "prefetch", "cache"]
    assert tuner.trials[1].undecided and tuner.trials[2].undecided and tuner.trials[3].kept
    assert result["tuned"] == {"pipeline.cache": "memory"}
    assert "Stopped: reached 0.9 of the compute ceiling" in (tmp_path / "tune.md").read_text()


def test_together_joins_the_overrides_and_multiplies_the_gains_of_two_or_more():
    def trial(number, ratio):
        done = Trial(number, "…", "…", {})
        done.against_incumbent = Comparison(ratio, (0.8, 1.3), "no difference detected")
        return done

    assert together([]) is None and together([(THREADS, trial(1, 1.05))]) is None
    joint = together([(THREADS, trial(1, 1.05)), (PREFETCH, trial(2, 0.97)), (CACHE, trial(3, 1.10))])
    assert joint.name == "parallelize + prefetch + cache" and joint.parts == ("parallelize", "prefetch", "cache")
    assert joint.overrides == {**THREADS.overrides, **PREFETCH.overrides, **CACHE.overrides}
    assert joint.gain == pytest.approx(1.12 * 1.10 * 1.5)
    assert "parallelize ×1.05 (trial 1), prefetch ×0.97 (trial 2), cache ×1.10 (trial 3)" in joint.reason
    assert "(model: ×1.85, the product of what it expected of each)" in joint.reason
