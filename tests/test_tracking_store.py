"""The store bwopt opens: experiments read well in MLflow's UI whoever created them."""

from bwopt.schema import MlflowTracking
from bwopt.tracking import MlflowTracker, ParentRun


def test_an_experiment_made_elsewhere_gets_bwopts_description_and_kind(tmp_path, mlflow_client, mlflow_uri):
    mlflow_client.create_experiment("made_elsewhere", artifact_location=(tmp_path / "art").as_uri())
    tracker = MlflowTracker(MlflowTracking(uri=mlflow_uri, experiment="made_elsewhere", system_metrics=False))
    tracker.start({}, {}, [])
    tracker.end("FINISHED")
    tags = mlflow_client.get_experiment_by_name("made_elsewhere").tags
    assert tags["mlflow.experimentKind"] == "custom_model_development" and "bwopt runs" in tags["mlflow.note.content"]


def test_a_sweep_that_creates_the_experiment_gives_it_the_same_tags(tmp_path, mlflow_client, mlflow_uri):
    tracking = MlflowTracking(uri=mlflow_uri, experiment="made_by_a_sweep")
    parent = ParentRun.start(tracking, "sweep x=1,2", tmp_path)
    parent.end("FINISHED", None)
    tags = mlflow_client.get_experiment_by_name("made_by_a_sweep").tags
    assert tags["mlflow.experimentKind"] == "custom_model_development" and "bwopt runs" in tags["mlflow.note.content"]


def test_a_long_report_is_cut_at_a_line_to_fit_mlflows_description_limit():
    from bwopt.tracking.sweeps import MAX_DESCRIPTION_CHARS, within_limit

    report = "\n".join(f"| trial {index} | pipeline.prefetch={index} | 1,000 examples/s |" for index in range(500))
    cut = within_limit(report)
    assert len(report) > MAX_DESCRIPTION_CHARS >= len(cut)
    kept, note = cut.split("\n\n… ")
    assert report.startswith(kept) and report[len(kept)] == "\n" and "report.md" in note
    assert within_limit("short") == "short"


def test_a_silent_server_is_given_up_on_after_the_start_timeout_the_user_set(monkeypatch):
    """A server that accepts and never answers: the start-up probe gives up after the user's
    MLFLOW_HTTP_REQUEST_TIMEOUT (bwopt's 5 s when unset), and says how long it waited."""
    import socket
    import time

    import pytest

    from bwopt.tracking.preflight import BOUNDS_SET_ENV, TrackingUnavailable, probe_server, start_timeout_s

    monkeypatch.delenv(BOUNDS_SET_ENV, raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    assert start_timeout_s() == 5
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "0.5")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        began = time.monotonic()
        with pytest.raises(TrackingUnavailable, match=r"did not answer within 0\.5 s"):
            probe_server(f"http://127.0.0.1:{server.getsockname()[1]}")
        assert 0.4 < time.monotonic() - began < 5
