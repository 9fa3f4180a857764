"""`python -m bwopt` as users run it: fresh processes, the default store, multirun, a wheel."""

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, TEST_DEFAULTS, run_bwopt

pytestmark = pytest.mark.slow
TINY = ["train.epochs=2", "train.warmup_steps=3"]


def runs_in(database):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("bwopt")
    return client, client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def test_module_run_uses_the_default_store_and_logs_hydra_folder(tmp_path):
    result = run_bwopt(*TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for line in ("throughput", "examples/s", "step time", "p50", "p90", "input wait", "val accuracy", "MLflow run"):
        assert line in result.stdout
    client, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.run_id in result.stdout
    assert run.info.status == "FINISHED"
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", ".hydra"} <= artifacts and "config.yaml" not in artifacts  # Hydra's copy only
    hydra_files = {item.path for item in client.list_artifacts(run.info.run_id, ".hydra")}
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml"} <= hydra_files
    assert (tmp_path / "outputs" / "mlartifacts").is_dir()


def test_multirun_gives_one_mlflow_run_per_job(tmp_path):
    result = run_bwopt("-m", "pipeline.prefetch=0,2", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _, runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [run.data.params["pipeline.prefetch"] for run in children] == ["0", "2"]
    assert [run.info.run_name for run in children] == [f"pipeline.prefetch={n}" for n in (0, 2)]  # the swept key only
    assert all(run.info.status == "FINISHED" for run in runs)
    # The parent reads without unfolding: the sweep's figures and keys, and a comparison that states its noise.
    assert parent.data.metrics["num_jobs"] == 2 and parent.data.metrics["num_failed_jobs"] == 0
    fastest = max(child.data.metrics["throughput_examples_per_s"] for child in children)
    assert parent.data.metrics["throughput_examples_per_s"] == pytest.approx(fastest)
    assert parent.data.params["swept.pipeline.prefetch"] == "0,2"
    sentence = parent.data.tags["mlflow.note.content"].split("\n")[0]
    assert "95 % CI" in sentence and any(word in sentence for word in ("faster", "slower", "no difference detected"))
    assert sentence.strip("*") in result.stdout + result.stderr


def start_until_epoch(tmp_path, epoch: int, *overrides) -> subprocess.Popen:
    """`python -m bwopt OVERRIDES` in a fresh process, returned once it has printed epoch `epoch`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bwopt", *TEST_DEFAULTS, *overrides],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    deadline = time.monotonic() + 120
    for line in process.stdout:
        if line.startswith(f"epoch {epoch}/") or time.monotonic() > deadline:
            break
    return process


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_is_marked_killed_and_keeps_its_metrics(tmp_path, stop_signal):
    process = start_until_epoch(tmp_path, 3, "train.epochs=500", "train.warmup_steps=3")
    process.send_signal(stop_signal)
    _, stderr = process.communicate(timeout=120)
    # The shell's code for death by that signal, and one line instead of a traceback.
    assert process.returncode == 128 + stop_signal.value
    assert f"bwopt: stopped by {stop_signal.name}" in stderr and "Traceback" not in stderr
    client, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "KILLED"
    assert len(client.get_metric_history(run.info.run_id, "val_accuracy")) >= 3
    assert run.data.metrics["num_timed_steps"] >= 3 * (22 - 3)
    (summary_file,) = (tmp_path / "outputs" / "runs").glob("*/*/summary.json")
    # The KILLED run keeps the last finished epoch's metrics.
    assert json.loads(summary_file.read_text())["final_metrics"]["val_accuracy"] > 0


def test_config_folder_is_found_from_an_installed_wheel(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp_path / "dist",
            REPO,
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("bwopt-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, wheel], check=True)
    assert (site / "bwopt" / "conf" / "pipeline" / "tuned.yaml").is_file()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import bwopt.modes, bwopt.launch, bwopt.data.tfrecord, bwopt.measure.ceilings\n"
            "from bwopt.app import config_dir\n"
            "print(config_dir())",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip() == str(site / "bwopt" / "conf")
    composed = subprocess.run(
        [sys.executable, "-m", "bwopt", "strategy=mirrored", "--cfg", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert composed.returncode == 0, composed.stderr
    assert "name: mirrored" in composed.stdout


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_training_through_a_data_service_in_a_loopback_only_namespace(tmp_path, mode):
    """tf.data's servers bind 0.0.0.0, so the run goes into a network namespace holding only lo.

    local: bwopt starts the dispatcher and workers; remote: the launcher starts them first, as a
    cluster would, and bwopt is given the dispatcher's address.
    """
    namespace = ["unshare", "--user", "--map-root-user", "--net"]
    if shutil.which("unshare") is None or subprocess.run([*namespace, "true"], capture_output=True).returncode:
        pytest.skip("needs a user + network namespace (util-linux unshare) to keep the servers off the network")
    launcher = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests' / 'data')!r})\n"
        "from test_service import bring_up_loopback\n"
        "from bwopt.data.service import LocalDataService\n"
        "bring_up_loopback()\n"
        "arguments = sys.argv[1:]\n"
        "if 'pipeline.service.mode=remote' in arguments:\n"
        "    cluster = LocalDataService(2).__enter__()\n"
        "    arguments.append(f'pipeline.service.address={cluster.address}')\n"
        "sys.argv = ['bwopt', *arguments]\n"
        "runpy.run_module('bwopt', run_name='__main__')\n"
    )
    result = subprocess.run(
        [
            *namespace,
            sys.executable,
            "-c",
            launcher,
            *TINY,
            f"pipeline.service.mode={mode}",
            "pipeline.service.processing_mode=parallel_epochs",
            "pipeline.service.job_name=bwopt-test",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.data.params["pipeline.service.mode"] == mode
    if mode == "remote":
        assert run.data.params["pipeline.service.address"].startswith("grpc://127.0.0.1:")
    assert run.data.metrics["throughput_examples_per_s"] > 0
    assert run.data.metrics["val_accuracy"] > 0.5


def test_an_unreachable_service_ends_at_once_with_code_3_and_leaves_no_run(tmp_path):
    """TensorFlow would wait for a dead dispatcher forever; bwopt checks it before anything starts."""
    started = time.monotonic()
    result = run_bwopt("pipeline.service.mode=remote", "pipeline.service.address=grpc://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 3 and time.monotonic() - started < 60
    assert "pipeline.service.address='grpc://127.0.0.1:9': no tf.data dispatcher" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.slow  # fresh processes
def test_a_store_that_cannot_work_ends_the_run_before_tensorflow_is_imported(tmp_path):
    """A server that does not answer, or a sqlite file that cannot be made: one line, code 3, and
    TensorFlow (about 5 s to import) never loaded: the store is checked before the workload."""
    from conftest import free_port

    (tmp_path / "a_file").write_text("")
    for uri, message in (
        (f"http://127.0.0.1:{free_port()}", "the tracking server did not answer"),
        (f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}", "is a file, not a folder"),
    ):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "bwopt", f"tracking.uri={uri}", *TEST_DEFAULTS],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )
        lines = result.stderr.splitlines()
        errors = [line for line in lines if not line.startswith("import time:")]
        assert result.returncode == 3 and len(errors) == 1, result.stderr[-2000:]
        assert errors[0].startswith(f"bwopt: tracking.uri={uri}: ") and message in errors[0]
        imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
        assert "hydra" in imported and "tensorflow" not in imported and "mlflow" not in imported


def test_bad_data_ends_with_one_line_and_code_2(tmp_path):
    (tmp_path / "data.tfrecord").write_bytes(b"not a TFRecord file at all")
    (tmp_path / "more.tfrecord").write_bytes(b"")
    overrides = ["data=tfrecord", "split=uniform", "data.feature_shape=[8]", "data.num_classes=2"]
    result = run_bwopt(*overrides, f"data.file_pattern={tmp_path}/*.tfrecord", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"bwopt: bad data: {tmp_path}/data.tfrecord: record 0 has no valid TFRecord header" in result.stderr


def test_a_preempted_run_resumes_the_same_mlflow_run_to_the_same_total_steps(tmp_path):
    """SIGTERM writes a checkpoint; the same command with train.resume=true continues the same run."""
    command = [sys.executable, "-m", "bwopt", "train.epochs=5", "measure.memcpy_bandwidth=false", *TEST_DEFAULTS]
    environment = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    process = start_until_epoch(tmp_path, 2, *command[3:])
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "checkpoint written to" in stderr
    (state_file,) = (tmp_path / "outputs" / "runs").glob("*/*/checkpoint/state.json")
    stopped = json.loads(state_file.read_text())
    assert stopped["epochs_done"] >= 2 and len(stopped["compute_s"]) == stopped["epochs_done"] * 22

    resumed = subprocess.run(
        [*command, "train.resume=true"], cwd=tmp_path, capture_output=True, text=True, env=environment
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"after {stopped['epochs_done']} finished epoch(s)" in resumed.stdout
    client, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")  # one run: the same one, continued
    assert run.info.run_id == stopped["run_id"] and run.info.status == "FINISHED"
    # Every epoch once, the same timed steps as a run never stopped: 5 epochs x 22, less 5 warm-up each.
    assert [point.step for point in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]
    assert run.data.metrics["num_timed_steps"] == 5 * (22 - 5)
    assert run.data.metrics["val_accuracy"] > 0.85
    assert not state_file.exists()  # finished: nothing left to resume


def test_a_second_signal_while_the_run_records_keeps_what_was_measured(tmp_path):
    process = start_until_epoch(tmp_path, 2, "train.epochs=500", "train.warmup_steps=3")
    process.send_signal(signal.SIGTERM)
    for line in process.stderr:  # the loop stopped at its next step; the run's end has begun
        if "checkpoint written to" in line:
            break
    process.send_signal(signal.SIGTERM)  # while it records (memcpy test, plots, MLflow)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "keeping what was measured" in stderr, stderr[-3000:]
    (summary_file,) = (tmp_path / "outputs" / "runs").glob("*/*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "KILLED" and summary["figures"]["num_timed_steps"] >= 2 * (22 - 3)
    _, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "KILLED" and run.data.metrics["num_timed_steps"] == summary["figures"]["num_timed_steps"]
