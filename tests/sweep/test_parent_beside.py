"""A sweep under another launcher (bwopt.sweep.sweeper.ParentBeside): its parent run, report, failure
lines and config check, on Hydra's own in-process launcher (`hydra/launcher=basic`) and task functions
that crash as asked (no TensorFlow; tests/sweep/test_scale_out.py runs real jobs through submitit's)."""

import contextlib
import io
import json
import os

import pytest
import sweep_tasks
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobStatus
from hydra.errors import ConfigCompositionException
from hydra.types import HydraContext, RunMode
from mlflow import MlflowClient

from bwopt.app import config_dir, run_job
from bwopt.sweep.sweeper import ParentBeside, prepare_sweep
from bwopt.tracking import PARENT_RUN_ENV


def basic_launcher(sweep_dir, *overrides, task=sweep_tasks.crash, parent_name="tune pipeline", check_jobs=False):
    """Hydra's basic launcher for the real conf/, as a sweeper gets it from `prepare_sweep`."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        arguments = ["hydra/launcher=basic", f"hydra.sweep.dir={sweep_dir}", *overrides]
        config = hydra.compose_config("config", arguments, run_mode=RunMode.MULTIRUN)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
        return prepare_sweep(config, context, task, parent_name=parent_name, check_jobs=check_jobs)[1]


def parent_of(mlflow_uri, experiment):
    client = MlflowClient(tracking_uri=mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, parent


def test_jobs_under_another_launcher_see_one_parent_run_across_launches_which_holds_the_report(tmp_path, mlflow_uri):
    sweep = tmp_path / "sweep"
    launcher = basic_launcher(sweep, f"tracking.uri={mlflow_uri}", "tracking.experiment=beside_finished")
    assert isinstance(launcher, ParentBeside) and launcher.parent is None  # nothing started before a launch
    (first,) = launcher.launch([["+crash=none", "+throughput=100"]], initial_job_idx=0)
    (second,) = launcher.launch([["+crash=none", "+throughput=200"]], initial_job_idx=1)
    assert first.status is second.status is JobStatus.COMPLETED
    assert PARENT_RUN_ENV not in os.environ  # handed to the jobs only while they run
    seen = [json.loads((sweep / str(n) / "process.json").read_text())[PARENT_RUN_ENV] for n in (0, 1)]
    client, parent = parent_of(mlflow_uri, "beside_finished")
    assert seen == [parent.info.run_id] * 2
    assert parent.info.run_name.startswith("tune pipeline · ") and parent.info.status == "FINISHED"
    assert "report.md" in {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert "2 jobs" in (sweep / "report.md").read_text()


def test_the_parent_run_fails_when_every_job_failed_and_no_parent_without_mlflow(tmp_path, mlflow_uri):
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=beside_failed"]
    (result,) = basic_launcher(tmp_path / "sweep", *tracking).launch([["+crash=exception"]], initial_job_idx=0)
    assert result.status is JobStatus.FAILED
    _, parent = parent_of(mlflow_uri, "beside_failed")
    assert parent.info.status == "FAILED" and parent.data.tags["bwopt.end_reason"] == "every job failed"
    untracked = basic_launcher(tmp_path / "other", "tracking=none")
    (result,) = untracked.launch([["+crash=none", "+throughput=100"]], initial_job_idx=0)
    assert result.status is JobStatus.COMPLETED and untracked.parent is None  # no parent run, the report all the same
    assert "1 job" in (tmp_path / "other" / "report.md").read_text()


def test_a_failed_job_is_one_line_and_exit_code_1_when_a_plain_sweep_reads_it(tmp_path):
    """As under bwopt's launcher: Hydra's basic sweeper reads each result's `return_value`, which for
    a failed job prints one line naming it, and the sweep exits 1 instead of raising its error."""
    launcher = basic_launcher(tmp_path / "sweep", "tracking=none", parent_name=None)
    good, bad = launcher.launch([["+crash=none", "+throughput=100"], ["+crash=exception"]], initial_job_idx=0)
    assert good.return_value == 100 and bad.status is JobStatus.FAILED
    # not capsys: Hydra's job logging, set up in this process, would keep its stream past the test
    said = io.StringIO()
    with pytest.raises(SystemExit) as ended, contextlib.redirect_stderr(said):
        bad.return_value
    assert ended.value.code == 1
    line = said.getvalue().strip()
    assert line.startswith("bwopt: sweep failed: job #1 (+crash=exception) failed: ValueError: a bad value for")
    assert "1 of 2 job(s) failed" in line and "Traceback" not in line


def test_a_plain_sweep_refuses_every_bad_job_before_any_starts(tmp_path):
    """With bwopt's own task, `check_jobs` (the plain sweeper's) validates every job's config first."""
    launcher = basic_launcher(tmp_path / "sweep", "tracking=none", task=run_job, parent_name=None, check_jobs=True)
    said = io.StringIO()
    with pytest.raises(SystemExit) as ended, contextlib.redirect_stderr(said):
        jobs = [["pipeline.prefetch=2"], ["pipeline.prefetch=-3"], ["train.optimizer=sgdx"]]
        launcher.launch(jobs, initial_job_idx=0)
    assert ended.value.code == 2
    lines = said.getvalue().strip().splitlines()
    assert lines[0] == "bwopt: invalid config in 2 of the sweep's jobs; none was started:"
    assert lines[1].startswith("  job 1 (pipeline.prefetch=-3): pipeline.prefetch=-3 is out of range")
    expected = "train.optimizer='sgdx' is not allowed; expected one of: adam, sgd, rmsprop"
    assert lines[2] == f"  job 2 (train.optimizer=sgdx): {expected}"
    assert not (tmp_path / "sweep").exists() or not list((tmp_path / "sweep").iterdir())


def test_a_launch_that_raises_ends_the_parent_run_failed(tmp_path, mlflow_uri):
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=beside_raised"]
    launcher = basic_launcher(tmp_path / "sweep", *tracking)
    with pytest.raises(ConfigCompositionException):  # Hydra cannot compose the job: no job ran
        launcher.launch([["no_such_group=value"]], initial_job_idx=0)
    _, parent = parent_of(mlflow_uri, "beside_raised")
    assert parent.info.status == "FAILED" and parent.data.tags["bwopt.end_reason"] == "the launch failed"
    assert PARENT_RUN_ENV not in os.environ


def test_a_stopped_sweep_ends_the_parent_run_killed_with_the_signal(tmp_path, mlflow_uri):
    sweep = tmp_path / "sweep"
    launcher = basic_launcher(sweep, f"tracking.uri={mlflow_uri}", "tracking.experiment=beside_stopped")

    with sweep_tasks.sigterm_once_waiting(sweep / "0" / "waiting"), pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        launcher.launch([["+crash=wait_for_stop"]], initial_job_idx=0)
    _, parent = parent_of(mlflow_uri, "beside_stopped")
    assert parent.info.status == "KILLED" and parent.data.tags["bwopt.end_reason"] == "stopped by SIGTERM"
    assert PARENT_RUN_ENV not in os.environ


@pytest.mark.parametrize(
    "selection,sweeper",
    [
        ([], "BwoptBasicSweeper"),
        (["experiment=pipelines"], "BwoptBasicSweeper"),
        (["tune=pipeline"], "BwoptTuner"),
        (["hparams_search=pipeline"], "BwoptSweeper"),
        (["hydra/sweeper=basic"], "BasicSweeper"),
    ],
)
def test_a_plain_sweep_takes_bwopts_basic_sweeper_and_a_tuning_or_search_its_own(selection, sweeper):
    """conf/plain_sweep.yaml sits before experiment, hparams_search and tune in config.yaml's
    defaults: of two overrides of hydra/sweeper the later entry's wins, the command line's first."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        config = compose(config_name="config", overrides=selection, return_hydra_config=True)
    assert config.hydra.sweeper._target_.rsplit(".", 1)[1] == sweeper
