"""`python -m bwopt` stopped, killed and resumed as a user's machine would do it: real signals to real
processes, a real sqlite store, real sweeps. Every test starts processes, so all are slow."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, as_a_terminals_job, count_runs, known_answer, run_bwopt

pytestmark = pytest.mark.slow
ENVIRONMENT = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}


def start(tmp_path: Path, *overrides, env=None, group: bool = False) -> subprocess.Popen:
    """`python -m bwopt OVERRIDES` running; group=True: in a process group of its own, as a terminal's job."""
    return subprocess.Popen(
        [sys.executable, "-m", "bwopt", *overrides, "measure.min_timed_s=0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # its scratch files too (a launcher killed by SIGKILL cannot remove its job files)
        env={**ENVIRONMENT, "TMPDIR": str(tmp_path), **(env or {})},
        start_new_session=group,
        preexec_fn=as_a_terminals_job,
    )


def read_until(stream, marker: str, timeout_s: float = 180) -> str:
    """Lines of `stream` up to the first holding `marker` (the process keeps running)."""
    seen, deadline = [], time.monotonic() + timeout_s
    for line in stream:
        seen.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    assert marker in "".join(seen), "".join(seen)[-3000:]
    return "".join(seen)


def runs_in(database: Path, experiment: str = "bwopt"):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    found = client.get_experiment_by_name(experiment)
    return client, client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"]) if found else []


def stop_and_time(process: subprocess.Popen, signum: int, timeout_s: float = 120):
    process.send_signal(signum)
    sent = time.monotonic()
    stdout, stderr = process.communicate(timeout=timeout_s)
    return stdout, stderr, time.monotonic() - sent


def test_sighup_ends_the_run_killed_as_sigterm_does(tmp_path):
    """The terminal or the SSH session closed: exit 129, the MLflow run KILLED with what it measured."""
    process = start(tmp_path, "train.epochs=500", "train.warmup_steps=3", "measure.progress=false")
    read_until(process.stdout, "epoch 2/")
    _, stderr, _ = stop_and_time(process, signal.SIGHUP)
    assert process.returncode == 129 and "bwopt: stopped by SIGHUP" in stderr and "Traceback" not in stderr
    client, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "KILLED" and run.data.tags["bwopt.end_reason"] == "stopped by SIGHUP"
    assert run.data.metrics["num_timed_steps"] >= 2 * (22 - 3)


def write_many_records(path: Path, num_records: int) -> None:
    import tensorflow as tf

    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "features": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(8)])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
            }
        )
    ).SerializeToString()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(num_records):
            writer.write(example)


@pytest.mark.timing
def test_a_signal_while_the_records_are_counted_stops_at_once_and_leaves_no_run(tmp_path):
    """Before the MLflow run exists, the first signal stops any phase (here: counting the user's
    records, file by file in Python) at once, and no run is made only to be marked KILLED."""
    data = tmp_path / "data"
    data.mkdir()
    write_many_records(data / "big.tfrecord", 3_000_000)
    write_many_records(data / "small.tfrecord", 10)  # held out for validation
    overrides = ["data=tfrecord", "split=uniform", f"data.file_pattern={data}/*.tfrecord", "data.feature_shape=[8]"]
    process = start(tmp_path, *overrides, "data.num_classes=2", env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until it reads the file
        try:
            if any(item.path.endswith("big.tfrecord") for item in psutil.Process(process.pid).open_files()):
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[1][-3000:]
    _, stderr, took_s = stop_and_time(process, signal.SIGTERM)
    assert process.returncode == 143, stderr[-3000:]
    known_answer(took_s < 3, f"stopped {took_s:.1f} s after SIGTERM, bound 3 s")
    assert "bwopt: stopped by SIGTERM" in stderr and "Traceback" not in stderr
    assert count_runs(tmp_path / "outputs" / "mlflow.db") == 0


def test_a_named_pipe_among_the_data_files_is_refused_up_front_instead_of_blocking(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes, which would be forever."""
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "a.tfrecord")
    write_many_records(data / "b.tfrecord", 10)
    overrides = ["data=tfrecord", "split=uniform", f"data.file_pattern={data}/*.tfrecord", "data.feature_shape=[8]"]
    started = time.monotonic()
    result = run_bwopt(*overrides, "data.num_classes=2", cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and time.monotonic() - started < 60, result.stderr[-3000:]
    assert f"bwopt: bad data: {data}/a.tfrecord" in result.stderr and "is a named pipe" in result.stderr
    assert "Traceback" not in result.stderr and count_runs(tmp_path / "outputs" / "mlflow.db") == 0


@pytest.mark.parametrize(
    "phase",
    [
        # the ceilings' loops check the stop between steps
        ["measure.ceilings=true", "measure.ceiling_steps=100000000"],
        # forward passes outside any loop of steps: the first signal raises at once
        ["measure.ceilings=false", "measure.inference_batch_sizes=[1]", "measure.inference_batches=100000000"],
    ],
    ids=["ceilings", "inference"],
)
def test_a_signal_after_training_stops_the_phase_within_seconds_and_keeps_what_was_measured(tmp_path, phase):
    """A phase of 100000000 steps or batches would run for hours: the first signal ends it."""
    overrides = ["train.epochs=2", *phase]
    process = start(tmp_path, *overrides, "measure.progress=false", "measure.memcpy_bandwidth=false")
    read_until(process.stdout, "epoch 2/2")
    time.sleep(3)  # the validation pass, the host references: the phase is running now
    _, stderr, took_s = stop_and_time(process, signal.SIGTERM)
    # the phase left would take hours; what follows the stop (checkpoint, summary, the MLflow run's
    # end) takes seconds idle and 16 s was seen beside two busy loops and two test workers
    assert process.returncode == 143 and took_s < 60, (took_s, stderr[-3000:])
    assert "Traceback" not in stderr
    _, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "KILLED" and run.data.tags["bwopt.end_reason"] == "stopped by SIGTERM"
    (summary_file,) = (tmp_path / "outputs" / "runs").glob("*/*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "KILLED" and summary["figures"]["num_timed_steps"] >= 2 * (22 - 5)
    assert summary["figures"]["dispatch_overhead_s"] > 0  # measured before the ceilings, kept


@pytest.mark.parametrize(
    "signum, code, other",
    [(signal.SIGTERM, 143, "SIGINT"), (signal.SIGINT, 130, "SIGTERM"), (signal.SIGHUP, 129, "SIGTERM")],
)
def test_a_stopped_sweep_is_one_line_and_its_parent_run_says_why(tmp_path, signum, code, other):
    """SIGTERM from a scheduler reaches the launcher alone; Ctrl-C in a terminal, and SIGHUP when
    the terminal or the SSH session closes, reach the launcher and its job together (the terminal
    signals the whole process group)."""
    process = start(tmp_path, "-m", "pipeline.prefetch=0,2", "train.epochs=500", "measure.progress=false", group=True)
    read_until(process.stdout, "epoch 2/")
    if signum in (signal.SIGINT, signal.SIGHUP):
        os.killpg(process.pid, signum)
        stdout, stderr = process.communicate(timeout=120)
    else:
        stdout, stderr, _ = stop_and_time(process, signum)
    name = signum.name
    assert process.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.endswith(f"bwopt: job stopped by {name}\nbwopt: stopped by {name}\n")
    assert f"was stopped by {name} (exit code {code})" in stdout and f"by {other}" not in stdout + stderr
    _, runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    (child,) = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "KILLED" and parent.data.tags["bwopt.end_reason"] == f"stopped by {name}"
    assert child.info.status == "KILLED" and child.data.tags["bwopt.end_reason"] == f"stopped by {name}"


def test_a_killed_sweep_launcher_takes_its_running_job_with_it(tmp_path):
    """SIGKILL leaves the launcher no time; the kernel sends its job SIGTERM (PR_SET_PDEATHSIG),
    so the job stops as on any SIGTERM: its MLflow run KILLED with what it measured."""
    process = start(tmp_path, "-m", "pipeline.prefetch=0,2", "train.epochs=500", "measure.progress=false")
    read_until(process.stdout, "epoch 2/")
    jobs = psutil.Process(process.pid).children(recursive=True)
    assert jobs
    process.kill()
    process.communicate()
    gone, alive = psutil.wait_procs(jobs, timeout=60)
    assert not alive, f"jobs left training after their launcher was killed: {alive}"
    _, runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    (child,) = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    assert child.info.status == "KILLED" and child.data.tags["bwopt.end_reason"] == "stopped by SIGTERM"
    assert child.data.metrics["num_timed_steps"] > 0  # what it measured, kept
    # The launcher could end nothing: its parent run is marked KILLED by the next start on this host.
    from bwopt.tracking.store import reap_dead_runs

    client, _ = runs_in(tmp_path / "outputs" / "mlflow.db")
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert reap_dead_runs(client, [parent.info.experiment_id]) == [parent.info.run_id]
    assert client.get_run(parent.info.run_id).info.status == "KILLED"


def test_a_killed_job_fails_the_sweep_in_one_line_naming_the_first_failed_job(tmp_path):
    process = start(tmp_path, "-m", "train.epochs=200,3", "measure.progress=false", "measure.memcpy_bandwidth=false")
    read_until(process.stdout, "epoch 1/200")
    (job,) = [child for child in psutil.Process(process.pid).children() if "bwopt.sweep.job" in child.cmdline()]
    job.kill()
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert "epoch 3/3" in stdout  # the sweep went on with the next job
    (line,) = [line for line in stderr.splitlines() if line.startswith("bwopt: sweep failed:")]
    assert line.startswith("bwopt: sweep failed: job #0 (train.epochs=200 ")
    assert ") was killed by SIGKILL; 1 of 2 job(s) failed; see " in line
    _, runs = runs_in(tmp_path / "outputs" / "mlflow.db")
    killed = [run for run in runs if run.data.params.get("train.epochs") == "200"]
    assert [run.info.status for run in killed] == ["KILLED"]  # not left RUNNING


@pytest.mark.parametrize("setting", ["hydra.launcher.repeats=0", "hydra.launcher.max_parallel=0"])
def test_launcher_settings_are_checked_like_any_key(tmp_path, setting):
    result = run_bwopt("-m", "pipeline.prefetch=0,2", setting, cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "Error in call" not in result.stderr
    assert f"bwopt: invalid config: {setting} is out of range; expected an integer >= 1" in result.stderr


@pytest.mark.parametrize(
    "sweep, message",
    [
        ("hparams_search=pipeline hydra.sweeper.n_trials=0", "hydra.sweeper.n_trials=0 and n_jobs=1 must both be >= 1"),
        ("tune=pipeline hydra.sweeper.max_trials=0", "hydra.sweeper.max_trials=0; expected an integer >= 1"),
    ],
)
def test_search_and_tune_settings_are_checked_like_any_key(tmp_path, sweep, message):
    result = run_bwopt("-m", *sweep.split(), cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "Error in call" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"bwopt: invalid config: {message}"
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def stopped_run(tmp_path: Path, folder: Path, *overrides, after_epoch: int = 2) -> dict:
    """A run in `folder` stopped by SIGTERM after `after_epoch` epochs; its checkpoint's state."""
    process = start(tmp_path, f"hydra.run.dir={folder}", *overrides, "measure.progress=false")
    read_until(process.stdout, f"epoch {after_epoch}/")
    _, stderr, _ = stop_and_time(process, signal.SIGTERM)
    assert process.returncode == 143 and "checkpoint written to" in stderr, stderr[-3000:]
    return json.loads((folder / "checkpoint" / "state.json").read_text())


def test_a_run_resumes_only_with_its_own_config_and_ends_without_its_stop_reason(tmp_path):
    folder = tmp_path / "run"
    model = ["model.hidden_units=[128]", "train.epochs=4", "measure.memcpy_bandwidth=false"]
    state = stopped_run(tmp_path, folder, *model)
    other = ["model.hidden_units=[16]", "train.epochs=4", "train.resume=true", f"hydra.run.dir={folder}"]
    refused = run_bwopt(*other, cwd=tmp_path, env=ENVIRONMENT)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "cannot resume with another config: model.hidden_units=[128] (now [16])" in refused.stderr
    client, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "KILLED"  # not reopened
    # train.epochs and measure.* may change.
    resumed = run_bwopt(*model[:1], "train.epochs=5", "train.resume=true", f"hydra.run.dir={folder}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED" and "bwopt.end_reason" not in run.data.tags
    assert [point.step for point in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]
    # MLflow keeps the param the run started with; the value it resumed with is a tag beside it
    assert run.data.params["train.epochs"] == "4" and run.data.tags["bwopt.resumed_with.train.epochs"] == "5"
    assert "bwopt.resumed_with.model.hidden_units" not in run.data.tags


def test_a_resume_killed_with_sigkill_and_resumed_again_logs_every_epoch_once(tmp_path):
    folder = tmp_path / "run"
    overrides = ["train.epochs=30", "measure.memcpy_bandwidth=false"]
    state = stopped_run(tmp_path, folder, *overrides)
    process = start(tmp_path, f"hydra.run.dir={folder}", *overrides, "train.resume=true", "measure.progress=false")
    read_until(process.stdout, f"epoch {state['epochs_done'] + 3}/")
    process.kill()  # after it logged epochs its checkpoint does not know about
    process.communicate()
    resumed = run_bwopt(*overrides, "train.resume=true", f"hydra.run.dir={folder}", cwd=tmp_path, env=ENVIRONMENT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client, (run,) = runs_in(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "FINISHED"
    assert [point.step for point in client.get_metric_history(run.info.run_id, "loss")] == list(range(1, 31))
