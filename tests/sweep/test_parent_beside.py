"""A sweeper's parent run under another launcher (bwopt.sweep.sweeper.ParentBeside), on Hydra's own
in-process launcher (`hydra/launcher=basic`) and task functions that crash as asked (no TensorFlow)."""

import json
import os

import pytest
import sweep_tasks
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobStatus
from hydra.errors import ConfigCompositionException
from hydra.types import HydraContext, RunMode
from mlflow import MlflowClient

from bwopt.app import config_dir
from bwopt.sweep.sweeper import ParentBeside, prepare_sweep
from bwopt.tracking import PARENT_RUN_ENV


def basic_launcher(sweep_dir, *overrides):
    """Hydra's basic launcher for the real conf/, as a sweeper gets it from `prepare_sweep`."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        arguments = ["hydra/launcher=basic", f"hydra.sweep.dir={sweep_dir}", *overrides]
        config = hydra.compose_config("config", arguments, run_mode=RunMode.MULTIRUN)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
        return prepare_sweep(config, context, sweep_tasks.crash, parent_name="tune pipeline")[1]


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
    assert not isinstance(basic_launcher(tmp_path / "other", "tracking=none"), ParentBeside)


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
