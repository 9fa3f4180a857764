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


@pytest.mark.slow  # a new sqlite store: seconds
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


@pytest.mark.slow  # a new sqlite store: seconds
def test_a_signal_as_a_run_starts_or_writes_to_a_sqlite_store_leaves_no_run_running_and_the_store_writable(
    tmp_path, installed
):
    """A KeyboardInterrupt raised inside SQLAlchemy's sqlite session would leave the file's write
    lock held for the rest of the process: the run's KILLED status would wait out the busy timeout
    (20 s) and fail. Signals at chance moments of a run's start and of a stream of its writes: a
    run stopped as it started is deleted (it measured nothing), every other ends KILLED at once."""
    import random
    import signal
    import threading
    import time

    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config = MlflowTracking(uri=uri, experiment="stopped", system_metrics=False)
    starts_s, timing_runs = [], []  # a start's usual time, the store made by the first
    for _ in range(4):
        started = time.monotonic()
        timing_runs.append(MlflowTracker(config).start({"a": "1"}, tags={}))
        starts_s.append(time.monotonic() - started)
    random.seed(0)
    stopped_starting, attempts = 0, 24
    for attempt in range(attempts):  # without the shield, 2 in 5 stopped writes left the store locked
        installed.reset()
        tracker = MlflowTracker(config)
        within_start = attempt % 2 == 0  # every other signal within a start's usual time, the others in the writes
        if within_start:
            threading.Timer(random.uniform(0.001, min(starts_s[1:])), os.kill, (os.getpid(), signal.SIGTERM)).start()
        try:
            tracker.start({"a": "1"}, tags={})
        except KeyboardInterrupt:
            stopped_starting += 1
            assert tracker.run_id is None and not tracker.failures, (attempt, tracker.failures)
            continue
        if not within_start:
            threading.Timer(random.uniform(0.001, 0.03), os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(KeyboardInterrupt):
            for step in range(1_000_000):
                tracker.log_metrics({"loss": 1.0}, step=step)
        installed.finishing = True
        started = time.monotonic()
        tracker.end("KILLED")
        assert time.monotonic() - started < 5 and not tracker.failures, (attempt, tracker.failures)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("stopped").experiment_id], run_view_type=ViewType.ALL)
    deleted = [run for run in runs if run.info.lifecycle_stage == "deleted"]
    assert stopped_starting > 0 and len(deleted) == stopped_starting, (stopped_starting, starts_s)
    ended = [
        run.info.status for run in runs if run.info.lifecycle_stage == "active" and run.info.run_id not in timing_runs
    ]
    assert ended == ["KILLED"] * (attempts - stopped_starting)


@pytest.mark.slow  # a new sqlite store: seconds
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


@pytest.mark.slow  # five processes
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


@pytest.mark.slow  # a new sqlite store: seconds
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


@pytest.mark.timing
@pytest.mark.slow
def test_the_first_signal_stops_a_run_that_waits_on_a_silent_tracking_server(tmp_path):
    """A server that accepts and never answers: the wait gives way to Ctrl-C at once, exit 130."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    from conftest import REPO, known_answer

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    command = [sys.executable, "-m", "bwopt", f"tracking.uri=http://127.0.0.1:{port}"]
    # The start-up wait made long (the user's own MLflow variable wins over bwopt's 5 s): a stop that
    # waited it out would take a minute, one that gives way takes about a second on a busy machine.
    environment = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        server.settimeout(60)
        connection, _ = server.accept()  # bwopt now waits for an answer that never comes
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        _, stderr = process.communicate(timeout=90)
        took_s = time.monotonic() - stopped
        assert process.returncode == 130 and "bwopt: stopped by SIGINT" in stderr and "Traceback" not in stderr
        known_answer(took_s < 10, f"stopped {took_s:.1f} s after SIGINT, bound 10 s (the start-up wait is 60 s)")
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
    command.append("measure.min_timed_s=0")  # the epochs' steps only: the count below
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
    # The run stays RUNNING in MLflow until completed: the last line says how.
    assert f"once the store answers again, run: python -m bwopt.tracking complete {folder}" in stderr
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


def test_a_sqlite_store_that_cannot_be_written_stops_the_run_at_once_naming_the_key_and_the_cause(tmp_path):
    from bwopt.tracking import TrackingUnavailable

    (tmp_path / "a_file").write_text("")  # no database can be made inside a file, even by root
    (tmp_path / "a_folder.db").mkdir()
    for database, cause in (
        (tmp_path / "a_file" / "mlflow.db", f"{tmp_path}/a_file is a file, not a folder"),
        (tmp_path / "a_folder.db", f"{tmp_path}/a_folder.db is a folder, not a database file"),
    ):
        tracker = MlflowTracker(MlflowTracking(uri=f"sqlite:///{database}", experiment="x"))
        with pytest.raises(TrackingUnavailable, match=f"^tracking.uri=sqlite:///{database}: {cause}; point"):
            tracker.start({}, {}, [])
    assert (tmp_path / "a_file").read_text() == "" and not any((tmp_path / "a_folder.db").iterdir())


class _AuthServer:
    """A small HTTP server on 127.0.0.1 that answers /health and wants Basic credentials for the API."""

    def __init__(self, password: str, api_status: int = 200) -> None:
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                seen.append((self.path, self.headers.get("Authorization")))
                wanted = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
                if self.path.startswith("/health"):
                    status = 200
                elif self.headers.get("Authorization") != wanted:
                    status = 401
                else:
                    status = api_status
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


import base64  # noqa: E402


@pytest.fixture
def no_credentials(monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_credentials_in_the_uri_reach_the_server_as_basic_auth_and_leave_the_uri(no_credentials):
    from bwopt.tracking.preflight import check_store, server_uri

    server = _AuthServer("s3cret")
    try:
        host = server.uri.removeprefix("http://")
        check_store(f"http://admin:s3cret@{host}")
        assert server.seen[0][0] == "/health" and "@" not in server_uri(f"http://admin:s3cret@{host}")
        expected = "Basic " + base64.b64encode(b"admin:s3cret").decode()
        assert server.seen[-1] == ("/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default", expected)
    finally:
        server.close()


def test_refused_credentials_and_server_errors_are_one_line_naming_the_uri_without_the_password(
    no_credentials, monkeypatch
):
    from bwopt.tracking import TrackingUnavailable
    from bwopt.tracking.preflight import check_store

    server = _AuthServer("right")
    try:
        host = server.uri.removeprefix("http://")
        with pytest.raises(TrackingUnavailable, match=r"refused the credentials \(401\)") as refused:
            check_store(f"http://admin:wrong@{host}")
        assert "wrong" not in str(refused.value) and f"http://admin:***@{host}" in str(refused.value)
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        with pytest.raises(TrackingUnavailable, match=r"set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"):
            check_store(server.uri)
    finally:
        server.close()
    failing = _AuthServer("right", api_status=500)
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "right")
        with pytest.raises(TrackingUnavailable, match=r"answered /api/2.0/mlflow/experiments/get-by-name with 500"):
            check_store(failing.uri)
    finally:
        failing.close()


@pytest.mark.slow
def test_a_real_basic_auth_server_takes_the_uri_credentials_and_the_password_is_written_nowhere(tmp_path):
    import subprocess
    import sys

    from conftest import REPO, mlflow_server
    from mlflow import MlflowClient

    folder = tmp_path / "run"
    # The server checks a password hash on every request: with every core busy one answer took more
    # than bwopt's 5 s start check, so the test gives it the user's own bound (MLflow's variable).
    environment = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
    common = ["train.epochs=1", "measure.memcpy_bandwidth=false", "tracking.system_metrics=false"]

    def bwopt(uri, run_dir, timeout):
        command = [sys.executable, "-m", "bwopt", f"tracking.uri={uri}", *common, f"hydra.run.dir={run_dir}"]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=environment, timeout=timeout)

    def holding(secret: bytes, run_dir):
        return [path for path in run_dir.rglob("*") if path.is_file() and secret in path.read_bytes()]

    with mlflow_server(tmp_path, app_name="basic-auth") as uri:
        host = uri.removeprefix("http://")
        refused = bwopt(uri, tmp_path / "refused", 120)
        assert refused.returncode == 3 and "refused the credentials (401)" in refused.stderr
        assert "Traceback" not in refused.stderr
        wrong = bwopt(f"http://admin:wrong-pass-1234@{host}", tmp_path / "wrong", 120)  # refused the same way
        assert wrong.returncode == 3 and "refused the credentials (401)" in wrong.stderr
        assert "Traceback" not in wrong.stderr and "wrong-pass-1234" not in wrong.stdout + wrong.stderr
        assert (tmp_path / "wrong" / ".hydra" / "config.yaml").is_file()  # Hydra wrote it, redacted
        assert holding(b"wrong-pass-1234", tmp_path / "wrong") == []
        result = bwopt(f"http://admin:bwopt-test-pass-7731@{host}", folder, 300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "bwopt-test-pass-7731" not in result.stdout + result.stderr
        assert holding(b"bwopt-test-pass-7731", folder) == []
        client = MlflowClient(tracking_uri=uri)
        import os

        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = "admin", "bwopt-test-pass-7731"
        try:
            (run,) = client.search_runs([client.get_experiment_by_name("bwopt").experiment_id])
            assert run.info.status == "FINISHED"
            assert "bwopt-test-pass-7731" not in repr(run.data.params) + repr(run.data.tags)
            artifacts = tmp_path / "artifacts"
            client.download_artifacts(run.info.run_id, "", str(artifacts))
            assert [p for p in artifacts.rglob("*") if p.is_file() and b"bwopt-test-pass-7731" in p.read_bytes()] == []
        finally:
            del os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]


# --- a store that cannot be used: one line naming tracking.uri and the cause, nothing written ---------


def initialised_store(folder):
    """A real MLflow sqlite store in `folder` (its schema made by the MLflow installed here); its path."""
    from mlflow import MlflowClient

    database = folder / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{database}").search_experiments()
    return database


def test_an_sqlite_file_of_random_bytes_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    from bwopt.tracking import TrackingUnavailable

    database = tmp_path / "mlflow.db"
    database.write_bytes(os.urandom(20000))
    before = database.read_bytes()
    tracker = MlflowTracker(MlflowTracking(uri=f"sqlite:///{database}", experiment="x"))
    with pytest.raises(TrackingUnavailable, match=r"tracking.uri=sqlite:///.*/mlflow.db: .* is not an SQLite database"):
        tracker.start({}, {}, [])
    assert database.read_bytes() == before


@pytest.mark.slow  # a new sqlite store and a process that locks it
def test_a_store_another_process_holds_locked_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    import subprocess
    import sys
    import time

    from bwopt.tracking import TrackingUnavailable, preflight

    database = initialised_store(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "connection = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "connection.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            str(database),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(preflight, "SQLITE_BUSY_WAIT_S", 2)
        tracker = MlflowTracker(MlflowTracking(uri=f"sqlite:///{database}", experiment="x"))
        started = time.monotonic()
        with pytest.raises(TrackingUnavailable, match=r"mlflow.db is locked by another process \(waited 2 s\)"):
            tracker.start({}, {}, [])
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow  # a new sqlite store
def test_a_store_of_a_newer_mlflow_schema_is_refused_in_one_line(tmp_path):
    import sqlite3

    from bwopt.tracking import TrackingUnavailable

    database = initialised_store(tmp_path)
    with sqlite3.connect(database) as connection:
        connection.execute("update alembic_version set version_num = 'ffffffffffff'")
    tracker = MlflowTracker(MlflowTracking(uri=f"sqlite:///{database}", experiment="x"))
    with pytest.raises(TrackingUnavailable, match=r"was made by another MLflow version \(schema revision ffffffffffff"):
        tracker.start({}, {}, [])
    with sqlite3.connect(database) as connection:
        assert connection.execute("select count(*) from runs").fetchone()[0] == 0


class _SilentApiServer:
    """An HTTP server on 127.0.0.1 that answers reads (the start-up probe passes) and never answers a write."""

    def __init__(self) -> None:
        import http.server
        import threading

        release = self.release = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                status = 200 if self.path.startswith("/health") else 404
                body = b"{}" if status == 200 else b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "none"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802
                release.wait(120)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.mark.slow  # waits for the bounded start
def test_a_server_whose_api_never_answers_stops_the_start_in_seconds_in_one_line(no_credentials, monkeypatch):
    import time

    from bwopt.tracking import TrackingUnavailable

    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    server = _SilentApiServer()
    try:
        tracker = MlflowTracker(MlflowTracking(uri=server.uri, experiment="silent"))
        started = time.monotonic()
        failed = f"tracking.uri={server.uri}: the store failed as the run started"
        with pytest.raises(TrackingUnavailable, match=failed):
            tracker.start({}, {}, [])
        assert time.monotonic() - started < 15  # each call of the start gives up after 5 s, no retries
    finally:
        server.close()
