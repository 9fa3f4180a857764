"""bwopt's launcher in this process, on task functions that crash in every way a job can (no TensorFlow)."""

import json
import os
import re

import pytest
import sweep_tasks
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.types import HydraContext, RunMode
from mlflow import MlflowClient

from bwopt.app import config_dir
from bwopt.sweep.launcher import JobCrashed
from bwopt.sweep.parent import sweep_name
from bwopt.tracking.names import NOTE_TAG

pytestmark = pytest.mark.slow  # every job is a fresh process


def launch(sweep_dir, job_overrides, *overrides):
    """Compose the real conf/ for a multirun and launch job_overrides with bwopt's launcher."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        config = hydra.compose_config("config", [f"hydra.sweep.dir={sweep_dir}", *overrides], run_mode=RunMode.MULTIRUN)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=sweep_tasks.crash, config=config
        )
        return launcher.launch(job_overrides, initial_job_idx=0)


def record(folder, name):
    return json.loads((folder / name).read_text())


def test_each_job_runs_alone_and_a_crash_fails_only_its_job(tmp_path):
    crashes = ["exception", "exit2", "segfault", "kill9", "none"]
    sweep = tmp_path / "sweep"
    returns = launch(sweep, [[f"+crash={crash}", "+throughput=100"] for crash in crashes], "tracking=none")
    assert [result.status for result in returns] == [JobStatus.FAILED] * 4 + [JobStatus.COMPLETED]
    exception, exit2, segfault, kill9, completed = (result._return_value for result in returns)
    assert isinstance(exception, ValueError) and "a bad value" in str(exception)
    assert isinstance(exit2, JobCrashed) and "exited with code 2" in str(exit2)
    assert isinstance(segfault, JobCrashed) and "SIGSEGV" in str(segfault)
    assert isinstance(kill9, JobCrashed) and "SIGKILL" in str(kill9)
    assert completed == pytest.approx(100 * 1.4)  # job 4
    assert [record(sweep / str(n), "job.json")["exit_code"] for n in range(5)] == [1, 2, -11, -9, 0]
    processes = [record(sweep / str(n), "process.json") for n in range(5)]
    assert len({process["pid"] for process in processes}) == 5 and os.getpid() not in {p["pid"] for p in processes}
    assert all(process["BWOPT_SWEEP_DIR"] == str(sweep.resolve()) for process in processes)
    assert all(process["BWOPT_PARENT_RUN_ID"] is None for process in processes)  # tracking=none: no parent
    report = (sweep / "report.md").read_text()
    assert "5 jobs, 4 failed" in report and "**Best overrides:** `+crash=none +throughput=100`" in report
    for status in ("**FAILED**", "(exit code 2)", "(exit code -11)", "(exit code -9)"):
        assert status in report


def test_repeats_run_in_interleaved_rounds_and_the_parent_run_holds_the_report(tmp_path, mlflow_uri):
    sweep = tmp_path / "sweep"
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=launcher_repeats"]
    job_overrides = [["+crash=none", "+throughput=100"], ["+crash=none", "+throughput=1000"]]
    returns = launch(sweep, job_overrides, "hydra.launcher.repeats=2", "hydra.launcher.max_parallel=1", *tracking)
    jobs = [record(sweep / str(n), "job.json") for n in range(4)]
    assert [job["overrides"][1] for job in jobs] == ["+throughput=100", "+throughput=1000"] * 2
    assert [job["repeat"] for job in jobs] == [0, 0, 1, 1]
    assert [job["started_at"] for job in jobs] == sorted(job["started_at"] for job in jobs)
    # one JobReturn per override set: the median of its repeats (jobs n get 1 + n/10 times the throughput)
    assert [result.return_value for result in returns] == pytest.approx([100 * 1.1, 1000 * 1.2])
    report = (sweep / "report.md").read_text()
    assert "| 1 | `+throughput=1000` | 2/2 | 1,200.0 | 1,100.0–1,300.0 |" in report
    assert "| 2 | `+throughput=100` | 2/2 | 110.0 | 100.0–120.0 |" in report

    client = MlflowClient(tracking_uri=mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("launcher_repeats").experiment_id])
    # named by the swept keys and the time it started: sweeps of the same overrides differ
    assert sweep_name(job_overrides) == "sweep +throughput=100,1000"
    assert re.fullmatch(r"sweep \+throughput=100,1000 · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", parent.info.run_name)
    assert parent.info.status == "FINISHED"
    assert "Best overrides" in parent.data.tags[NOTE_TAG] and "1,100.0–1,300.0" in parent.data.tags[NOTE_TAG]
    artifacts = {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "report.csv", "throughput.png", "throughput_vs_throughput.png"} <= artifacts
    assert {record(sweep / str(n), "process.json")["BWOPT_PARENT_RUN_ID"] for n in range(4)} == {parent.info.run_id}


def test_a_killed_job_shows_what_its_run_recorded_and_is_never_counted(tmp_path, mlflow_uri, monkeypatch):
    """A job killed before its summary.json: the report shows the figures of its MLflow run, marked,
    the run is KILLED, and neither the job nor its override set counts as finished."""
    monkeypatch.setenv("TEST_MLFLOW_URI", mlflow_uri)
    sweep = tmp_path / "sweep"
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=launcher_killed"]
    job_overrides = [["+crash=kill9_after_metrics", "+throughput=100"], ["+crash=none", "+throughput=100"]]
    returns = launch(sweep, job_overrides, *tracking)
    assert [result.status for result in returns] == [JobStatus.FAILED, JobStatus.COMPLETED]
    killed_run = record(sweep / "0", "job.json")["mlflow_run"]
    assert killed_run["metrics"]["throughput_examples_per_s"] == 123.0
    report = (sweep / "report.md").read_text()
    assert "2 jobs, 1 failed" in report
    row = next(line for line in report.splitlines() if line.startswith("| 0 | "))
    assert "**KILLED** (exit code -9): figures from its MLflow run, not counted | 123.0 | 25.0 | 2.000 |" in row
    assert "highly input-bound" in row and killed_run["run_id"] in row
    assert "| — | `+crash=kill9_after_metrics` | 0/1 **FAILED** |" in report  # no median from a killed job
    assert "**Best overrides:** `+crash=none +throughput=100`" in report or "Only +crash=none" in report

    client = MlflowClient(tracking_uri=mlflow_uri)
    assert client.get_run(killed_run["run_id"]).info.status == "KILLED"
    assert client.get_run(killed_run["run_id"]).info.run_name == "+crash=kill9_after_metrics"  # the swept key only


def test_the_parent_run_fails_when_every_job_failed(tmp_path, mlflow_uri):
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=launcher_all_failed"]
    (result,) = launch(tmp_path / "sweep", [["+crash=exception"]], *tracking)
    assert result.status is JobStatus.FAILED
    client = MlflowClient(tracking_uri=mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("launcher_all_failed").experiment_id])
    assert parent.info.status == "FAILED"
    assert "No job finished" in parent.data.tags[NOTE_TAG]


def test_a_stopped_sweep_stops_its_job_starts_no_more_and_ends_the_parent_killed(tmp_path, mlflow_uri):
    sweep = tmp_path / "sweep"
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=launcher_stopped"]

    with sweep_tasks.sigterm_once_waiting(sweep / "0" / "waiting"), pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        launch(sweep, [["+crash=wait_for_stop"], ["+crash=none", "+throughput=1"]], *tracking)
    assert record(sweep / "0", "job.json")["status"] == "FAILED"
    assert not (sweep / "1").exists()  # never started
    assert "1 jobs, 1 failed" in (sweep / "report.md").read_text()
    client = MlflowClient(tracking_uri=mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("launcher_stopped").experiment_id])
    assert parent.info.status == "KILLED" and parent.data.tags["bwopt.end_reason"] == "stopped by SIGTERM"
    # The job ended on the signal with the shell's code for it, not as if killed by SIGINT.
    assert record(sweep / "0", "job.json")["exit_code"] == 143


def test_a_failed_sweep_ends_in_one_line_naming_its_first_failed_job(tmp_path, capsys):
    """Hydra's sweepers read the outcome of each override set in order; the first one that failed
    ends the sweep with one line naming the first job that failed (its number, its overrides, how)."""
    sweep = tmp_path / "sweep"
    sets = [["+crash=none", "+throughput=1"], ["+crash=kill9"], ["+crash=exception"]]
    returns = launch(sweep, sets, "tracking=none", "hydra.launcher.repeats=2")
    assert [result.status for result in returns] == [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.FAILED]
    assert returns[0].return_value == pytest.approx(1 * (1 + 3 / 10) / 2 + 1 * (1 + 0 / 10) / 2)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        returns[2].return_value  # noqa: B018 (what Hydra's BasicSweeper reads)
    assert ended.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("bwopt: sweep failed: job #1 (+crash=kill9) was killed by SIGKILL; 4 of 6 job(s) failed")


@pytest.mark.parametrize("setting", ["hydra.launcher.repeats=0", "hydra.launcher.max_parallel=0"])
def test_launcher_settings_out_of_range_are_one_line_and_exit_2(tmp_path, capsys, setting):
    with pytest.raises(SystemExit) as ended:
        launch(tmp_path / "sweep", [["+crash=none"]], "tracking=none", setting)
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith(f"bwopt: invalid config: {setting} is out of range; expected")
    assert not (tmp_path / "sweep").exists()  # nothing started


def test_a_repeat_that_timed_nothing_is_left_out_of_its_sets_median_wherever_it_came():
    import math

    from bwopt.sweep.results import median_objective

    for order in ([math.nan, 100.0, 200.0], [100.0, math.nan, 200.0], [100.0, 200.0, math.nan]):
        assert median_objective(order) == 150.0
    assert median_objective([100.0, 300.0, 200.0]) == 200.0
    assert math.isnan(median_objective([math.nan, math.nan]))
