"""MLflow tracking: the config as params, and an outage that warns without ending the measurement."""

import os

import pytest

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


START_AND_DIE = """
import os, sys
from bwopt.schema import MlflowTracking
from bwopt.tracking import MlflowTracker
tracker = MlflowTracker(MlflowTracking(uri=sys.argv[1], experiment="reaped", system_metrics=False))
print(tracker.start({}, {}, []), flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), 9)  # as the OOM killer would: no chance to end the run
tracker.end("FINISHED")
"""


def start_runs(uri, *modes):
    import subprocess
    import sys

    processes = [
        subprocess.Popen([sys.executable, "-c", START_AND_DIE, uri, mode], stdout=subprocess.PIPE, text=True)
        for mode in modes
    ]
    return [(process.communicate(timeout=120)[0].strip(), process.returncode) for process in processes]


def test_runs_started_together_on_a_new_store_all_land_and_a_killed_one_is_reaped(tmp_path):
    """Four processes on a new sqlite store race in MLflow's migration; one of them dies by kill -9."""
    from mlflow import MlflowClient

    from bwopt.tracking import main

    uri = f"sqlite:///{tmp_path}/new/mlflow.db"
    results = start_runs(uri, "end", "end", "end", "die")
    assert [code for _, code in results] == [0, 0, 0, -9]
    client = MlflowClient(tracking_uri=uri)
    runs = {run_id: client.get_run(run_id).info.status for run_id, _ in results}
    assert len(runs) == 4 and list(runs.values()) == ["FINISHED"] * 3 + ["RUNNING"]
    # The next bwopt run on the store finds the dead process's run and marks it KILLED.
    ((next_run, code),) = start_runs(uri, "end")
    assert code == 0 and client.get_run(results[3][0]).info.status == "KILLED"
    assert "was gone" in client.get_run(results[3][0]).data.tags["bwopt.end_reason"]
    assert main(["reap", uri, "reaped"]) == 0  # the command finds nothing more to mark


def test_a_tracking_server_that_is_down_stops_the_run_within_seconds_naming_the_key():
    import time

    import pytest

    from bwopt.tracking import TrackingUnavailable

    tracker = MlflowTracker(MlflowTracking(uri="http://127.0.0.1:9", experiment="down"))
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable, match=r"tracking.uri=http://127.0.0.1:9: the tracking server did not"):
        tracker.start({}, {}, [])
    assert time.monotonic() - started < 10


def test_complete_logs_a_run_folder_to_its_run_after_an_outage(tmp_path):
    import json

    from mlflow import MlflowClient
    from omegaconf import OmegaConf

    from bwopt.tracking import main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = MlflowTracking(uri=uri, experiment="outage_later", system_metrics=False)
    run_id = MlflowTracker(tracking).start({}, {}, [])  # then the server went away: nothing more logged
    folder = tmp_path / "run"
    folder.mkdir()
    OmegaConf.save(
        OmegaConf.create({"tracking": {"uri": uri, "experiment": "outage_later"}, "train": {"epochs": 3}}),
        folder / "config.yaml",
    )
    summary = {
        "run_id": run_id,
        "status": "KILLED",
        "figures": {"throughput_examples_per_s": 1000.0, "step_time_p50_s": 0.002, "input_bound_verdict": "x"},
        "measurements": {"peak_host_rss_bytes": 2**20},
        "final_metrics": {"val_accuracy": 0.9},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    assert main(["complete", str(folder)]) == 0
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.metrics["step_time_p50_ms"] == 2.0 and run.data.metrics["peak_host_rss_mib"] == 1.0
    assert run.data.metrics["val_accuracy"] == 0.9


@pytest.mark.slow
def test_the_first_signal_stops_a_run_that_waits_on_a_silent_tracking_server(tmp_path):
    """A server that accepts and never answers: the wait gives way to Ctrl-C at once, exit 130."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    from conftest import REPO

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    command = [sys.executable, "-m", "bwopt", f"tracking.uri=http://127.0.0.1:{port}"]
    environment = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        server.settimeout(60)
        connection, _ = server.accept()  # bwopt now waits for an answer that never comes
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        assert time.monotonic() - stopped < 3  # the start-up wait alone would take 5 s
        assert process.returncode == 130 and "bwopt: stopped by SIGINT" in stderr and "Traceback" not in stderr
        connection.close()
    finally:
        process.kill()
        server.close()


@pytest.mark.slow
def test_a_tracking_server_that_dies_mid_run_loses_no_measurement(tmp_path):
    """The run goes on and finishes with its figures in the run folder; once the server is back,
    `python -m bwopt.tracking complete` gives the MLflow run what it missed."""
    import json
    import subprocess
    import sys

    from conftest import REPO, free_port, mlflow_server
    from mlflow import MlflowClient

    port, folder = free_port(), tmp_path / "run"
    command = [sys.executable, "-m", "bwopt", f"tracking.uri=http://127.0.0.1:{port}", "train.epochs=30"]
    command += [f"hydra.run.dir={folder}", "measure.memcpy_bandwidth=false", "tracking.system_metrics=false"]
    environment = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    with mlflow_server(tmp_path, port):
        process = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
        for line in process.stdout:
            if line.startswith("epoch 2/"):
                break
    # The server is gone from epoch 3 on.
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    assert "MLflow could not log metrics" in stderr and "epoch 30/30" in stdout
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["figures"]["num_timed_steps"] == 30 * (22 - 5)

    with mlflow_server(tmp_path, port) as uri:  # back, on the same store
        completed = subprocess.run(
            [sys.executable, "-m", "bwopt.tracking", "complete", str(folder)],
            capture_output=True,
            text=True,
            env={**environment, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.metrics["num_timed_steps"] == 30 * (22 - 5)
        assert run.data.metrics["val_accuracy"] == pytest.approx(summary["final_metrics"]["val_accuracy"])


def test_a_sqlite_store_that_cannot_be_written_stops_the_run_at_once_naming_the_key(tmp_path):
    from bwopt.tracking import TrackingUnavailable

    (tmp_path / "a_file").write_text("")  # no database can be made inside a file, even by root
    tracker = MlflowTracker(MlflowTracking(uri=f"sqlite:///{tmp_path}/a_file/mlflow.db", experiment="x"))
    with pytest.raises(TrackingUnavailable, match=r"tracking.uri=sqlite:///.*a_file/mlflow.db: .* is not writable"):
        tracker.start({}, {}, [])
