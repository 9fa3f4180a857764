"""MLflow tracking: the config as params, and an outage that warns without ending the measurement."""

import os

from bwopt.schema import MlflowTracking
from bwopt.tracking import MlflowTracker, flatten, sqlite_artifact_location


def test_flatten_gives_dotted_keys_and_string_values():
    assert flatten(
        {"pipeline": {"prefetch": 2, "interleave": {"cycle_length": "autotune"}}, "seed": 0, "tags": {}}
    ) == {
        "pipeline.prefetch": "2",
        "pipeline.interleave.cycle_length": "autotune",
        "seed": "0",
        "tags": "{}",
    }


def test_sqlite_artifacts_live_beside_the_database(tmp_path):
    location = sqlite_artifact_location(f"sqlite:///{tmp_path}/store/mlflow.db")
    assert location == (tmp_path / "store" / "mlartifacts").as_uri()
    assert sqlite_artifact_location("http://127.0.0.1:5000") is None


def test_a_tracking_outage_warns_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = MlflowTracker(MlflowTracking(uri=uri, experiment="outage", run_name="r", tags={"team": "perf"}))
    run_id = tracker.start({"a.b": "1"}, tags={"mode": "train"})
    tracker.log_metrics({"loss": 1.0}, step=0)
    # The tracking server goes away: nothing listens on port 9 of loopback.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    tracker.client = MlflowClient(tracking_uri="http://127.0.0.1:9")
    tracker.log_metrics({"loss": 0.5}, step=1)
    tracker.set_tags({"verdict": "x"})
    assert "MLflow could not log metrics" in capsys.readouterr().err
    tracker.client = MlflowClient(tracking_uri=uri)
    tracker.end("FINISHED")
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.tags["team"] == "perf" and run.data.tags["mode"] == "train"
    assert [point.value for point in MlflowClient(tracking_uri=uri).get_metric_history(run_id, "loss")] == [1.0]
    assert os.path.exists(tmp_path / "mlflow.db")


def test_a_run_is_named_and_tagged_from_its_overrides_and_its_source(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("BWOPT_PARENT_RUN_ID", "parent123")
    tracker = MlflowTracker(MlflowTracking(uri=uri, experiment="named"))
    overrides = ["pipeline.prefetch=10", "strategy=mirrored", f"tracking.uri={uri}", "hydra.job.num=3"]
    run_id = tracker.start({}, {"mode": "train"}, overrides)
    tracker.end("FINISHED")
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "pipeline.prefetch=10,strategy=mirrored"
    tags = run.data.tags
    assert tags["override.pipeline.prefetch"] == "10" and tags["override.strategy"] == "mirrored"
    assert "override.tracking.uri" not in tags and tags["mlflow.parentRunId"] == "parent123"
    assert tags["bwopt.pid"] == str(os.getpid()) and tags["bwopt.host"]
    # What MLflow's fluent API would set: who ran what, from where.
    for key in ("mlflow.source.name", "mlflow.source.type", "mlflow.user"):
        assert tags[key], key
    assert "bwopt" in client.get_experiment_by_name("named").tags["mlflow.note.content"]

    monkeypatch.delenv("BWOPT_PARENT_RUN_ID")
    plain = MlflowTracker(MlflowTracking(uri=uri, experiment="named"))
    plain_id = plain.start({}, {}, [])
    plain.end("FINISHED")
    assert client.get_run(plain_id).info.run_name == "default"
    assert "mlflow.parentRunId" not in client.get_run(plain_id).data.tags
