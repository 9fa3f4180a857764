"""What a sweep's runs are called in MLflow: parent names unique across sweeps, job and trial names
that carry only the swept keys (no process, no TensorFlow)."""

import json

from conftest import compose_config
from mlflow import MlflowClient

from bwopt.app import validate
from bwopt.sweep.parent import sweep_name, varied_keys
from bwopt.tracking import ParentRun
from bwopt.tracking.names import SWEPT_KEYS_ENV, run_name


def test_two_sweeps_of_the_same_overrides_get_different_parent_names(tmp_path, mlflow_uri):
    tracking = validate(compose_config([f"tracking.uri={mlflow_uri}", "tracking.experiment=parent_names"])).tracking
    job_overrides = [["pipeline.prefetch=0", "train.epochs=1"], ["pipeline.prefetch=2", "train.epochs=1"]]
    name = sweep_name(job_overrides)
    assert name == "sweep pipeline.prefetch=0,2"
    first, second = (ParentRun.start(tracking, name, tmp_path) for _ in range(2))
    client = MlflowClient(tracking_uri=mlflow_uri)
    names = [client.get_run(parent.run_id).info.run_name for parent in (first, second)]
    assert names[0] != names[1] and all(item.startswith("sweep pipeline.prefetch=0,2 · 20") for item in names)
    assert names[1] == names[0] + " #2" or names[1] > names[0]  # same second: numbered; else a later second


def test_a_job_run_is_named_by_the_swept_keys_only(monkeypatch):
    overrides = ["hparams_search=pipeline", "train.epochs=1", "+throughput=3", "pipeline.prefetch=2", "tracking=none"]
    assert run_name(overrides) == "hparams_search=pipeline,train.epochs=1,+throughput=3,pipeline.prefetch=2"
    monkeypatch.setenv(SWEPT_KEYS_ENV, json.dumps(["pipeline.prefetch", "+throughput"]))
    assert run_name(overrides) == "+throughput=3,pipeline.prefetch=2"
    monkeypatch.setenv(SWEPT_KEYS_ENV, json.dumps([]))  # a sweep of one job: nothing varies, every override shown
    assert run_name(overrides) == "hparams_search=pipeline,train.epochs=1,+throughput=3,pipeline.prefetch=2"


def test_the_varied_keys_are_those_whose_values_differ_or_that_some_jobs_lack():
    jobs = [["a=1", "b=1", "c=1"], ["a=2", "b=1"], ["a=3", "b=1", "c=1"]]
    assert varied_keys(jobs) == ["a", "c"]
    assert varied_keys([["a=1", "b=2"]]) == []
