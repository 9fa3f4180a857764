"""Multi-process runs on real local clusters: TensorFlow's own runtime, started by bwopt on 127.0.0.1.

Every test here starts real task processes (`python -m bwopt ... cluster=local`), so each is marked
slow; each keeps to 2 epochs of a few steps on the bundled digits.
"""

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, as_a_terminals_job, compose_config, known_answer

from bwopt.app import validate

SHORT = ["train.epochs=2", "train.steps_per_epoch=8", "train.warmup_steps=2", "measure.memcpy_bandwidth=false"]
MULTI_WORKER = ["strategy=multi_worker_mirrored", "cluster=local", "cluster.num_workers=2"]
PARAMETER_SERVER = ["strategy=parameter_server", "cluster=local", "cluster.num_workers=2", "strategy.num_ps=1"]
# Same data path for the synchronous strategies compared: one pipeline per worker, its own shard.
PER_WORKER_INPUT = ["pipeline.distribute.method=distribute_datasets_from_function", "pipeline.shuffle_buffer=0"]


def start_bwopt(tmp_path: Path, *overrides) -> subprocess.Popen:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return subprocess.Popen(
        [sys.executable, "-m", "bwopt", *overrides, f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=as_a_terminals_job,
    )


def descendants(process: subprocess.Popen):
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def watch(process: subprocess.Popen, timeout_s: float = 150):
    """Wait for the run; returns (stdout, stderr, listening addresses of its tasks, every task pid seen)."""
    listening, pids = set(), set()
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        for child in descendants(process):
            pids.add(child.pid)
            try:
                listening |= {c.laddr.ip for c in child.net_connections("inet") if c.status == psutil.CONN_LISTEN}
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        time.sleep(0.3)
    if process.poll() is None:
        process.kill()
    stdout, stderr = process.communicate()
    return stdout, stderr, listening, pids


def loss_history(tmp_path: Path, run_id: str):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return [metric.value for metric in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)]


def assert_gone(pids):
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"task processes left behind: {alive}"


@pytest.mark.slow
def test_multi_worker_mirrored_trains_on_two_local_processes_like_mirrored(tmp_path, run_experiment):
    process = start_bwopt(tmp_path, *MULTI_WORKER, *SHORT, *PER_WORKER_INPUT)
    stdout, stderr, listening, pids = watch(process)
    assert process.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_replicas"] == 2
    assert [device.split("/device")[0][-6:] for device in summary["devices"]] == ["task:0", "task:1"]
    assert summary["figures"]["throughput_examples_per_s"] > 0
    losses = loss_history(tmp_path, summary["run_id"])
    assert losses[1] < losses[0]
    # The other worker's figures are in the chief's run; it logged no run of its own.
    assert "task/worker1/throughput_examples_per_s" in run_metrics(tmp_path, summary["run_id"])
    cluster = json.loads((tmp_path / "run" / "cluster.json").read_text())
    assert set(cluster["tasks"]) == {"worker:0", "worker:1"}
    assert cluster["summaries"]["worker:1"]["run_id"] is None
    # TensorFlow's servers listened, on loopback only.
    assert listening and all(is_loopback(address) for address in listening), listening
    assert_gone(pids)
    # Same seed, same initial weights (MultiWorkerMirroredStrategy broadcasts the chief's), same
    # global batch and learning rate: only which examples share a batch differs (each worker reads
    # its own shard here, the one-process run splits one pipeline), so the first epoch's mean loss
    # (and the second's) differs by SGD noise only. 5 % relative allows that noise (measured: < 2 %) and
    # still fails a wrong gradient scale (2 replicas summing unscaled losses doubles the steps).
    mirrored = run_experiment("strategy=mirrored", "tracking=none", *SHORT, *PER_WORKER_INPUT)
    assert summary["final_metrics"]["loss"] == pytest.approx(mirrored.final_metrics["loss"], rel=0.05)


@pytest.mark.slow
def test_parameter_server_trains_with_one_server_and_two_workers(tmp_path):
    process = start_bwopt(tmp_path, *PARAMETER_SERVER, *SHORT)
    stdout, stderr, listening, pids = watch(process)
    assert process.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    losses = loss_history(tmp_path, summary["run_id"])
    assert losses[1] < losses[0]
    figures, measured = summary["figures"], summary["measurements"]
    # Steps overlap: throughput is the timed examples over the span the timed closures took
    # together, and it splits into the workers' shares of those steps.
    span, examples = measured["async_timed_wall_s"], figures["num_timed_steps"] * 64
    assert figures["timed_wall_s"] == pytest.approx(span)
    assert figures["throughput_examples_per_s"] == pytest.approx(examples / span)
    shares = [measured.get(f"worker{index}/throughput_examples_per_s", 0.0) for index in range(2)]
    assert sum(shares) == pytest.approx(figures["throughput_examples_per_s"])
    steps = [measured.get(f"worker{index}/num_timed_steps", 0) for index in range(2)]
    assert sum(steps) == figures["num_timed_steps"]
    assert 0 < measured["worker_busy_fraction"] <= 1.0
    assert summary["devices"] == [f"/job:worker/replica:0/task:{index}/device:CPU:0" for index in range(2)]
    assert set(json.loads((tmp_path / "run" / "cluster.json").read_text())["tasks"]) == {
        "chief:0",
        "ps:0",
        "worker:0",
        "worker:1",
    }
    assert listening and all(is_loopback(address) for address in listening), listening
    assert_gone(pids)


@pytest.mark.slow
def test_a_killed_worker_fails_the_run_names_it_and_leaves_no_process(tmp_path):
    process = start_bwopt(tmp_path, *MULTI_WORKER, "train.epochs=200", "train.warmup_steps=2", "measure.progress=false")
    log = tmp_path / "run" / "tasks" / "worker-1.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and "epoch 1/" in log.read_text()):
        time.sleep(0.3)
    tasks = descendants(process)
    victim = next(task for task in tasks if task.environ().get("BWOPT_CLUSTER_TASK") == "worker:1")
    killed_at = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    stdout, stderr, _, pids = watch(process, timeout_s=60)
    assert process.returncode == 1
    assert time.monotonic() - killed_at < 30  # the launcher polls every 0.2 s; stopping takes the grace at most
    assert f"cluster task worker:1 (pid {victim.pid}) was killed by SIGKILL" in stderr
    assert "Traceback" not in stderr  # the chief's lost all-reduce is one line, not gRPC's traceback
    assert_gone(pids | {task.pid for task in tasks})


@pytest.mark.slow
def test_real_workers_read_disjoint_shards_that_cover_the_training_split(tmp_path):
    from cluster_shard_task import OVERRIDES, feature_hash

    from bwopt.data.service import free_loopback_port
    from bwopt.data.sources import load_source
    from bwopt.inputs import plan
    from bwopt.launch import local_tasks, tf_config
    from bwopt.schema import MultiWorkerMirroredStrategy

    tasks = local_tasks(MultiWorkerMirroredStrategy(), 2, [free_loopback_port() for _ in range(2)])
    workers = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "cluster_shard_task.py"), str(tmp_path / f"{task.index}.json")],
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "TF_CONFIG": tf_config(tasks, task)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for task in tasks
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr[-3000:]
    shards = [set(json.loads((tmp_path / f"{index}.json").read_text())["hashes"]) for index in range(2)]
    config = validate(compose_config(OVERRIDES))
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    train = {feature_hash(row) for row in source.features[plan(config, source).train_indices]}
    assert shards[0] and shards[1] and not shards[0] & shards[1]
    assert shards[0] | shards[1] == train


def run_metrics(tmp_path: Path, run_id: str):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).data.metrics


# --- a cluster that cannot start: one line each, before TensorFlow joins anything ---------------------

TWO_WORKERS = ["strategy=multi_worker_mirrored", "cluster=tf_config", *SHORT]


def tf_config(task_type: str = "worker", index: int = 0, ports=(1, 2)) -> str:
    return json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]}, "task": {"type": task_type, "index": index}}
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "cluster, environment, message",
    [
        ("tf_config", {"TF_CONFIG": "{cluster: worker}"}, "TF_CONFIG is not JSON (Expecting property name"),
        ("tf_config", {"TF_CONFIG": tf_config(index=2)}, "TF_CONFIG: task index 2 is beyond the cluster's 2 worker"),
        ("tf_config", {"TF_CONFIG": tf_config("ps")}, "TF_CONFIG: task type 'ps' is not a job of its cluster (worker)"),
        ("tf_config", {}, "cluster=tf_config needs the TF_CONFIG environment variable"),
        ("slurm", {}, "cluster=slurm needs SLURM's variables, and SLURM_PROCID, SLURM_STEP_NUM_TASKS"),
    ],
)
def test_a_cluster_environment_that_is_wrong_is_one_line_naming_the_variable(tmp_path, cluster, environment, message):
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **environment}
    overrides = ["strategy=multi_worker_mirrored", f"cluster={cluster}", f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(
        [sys.executable, "-m", "bwopt", *overrides], cwd=tmp_path, capture_output=True, text=True, env=environment
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"bwopt: invalid cluster environment: {message}" in result.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # no run recorded


def lone_worker(tmp_path: Path, *overrides) -> subprocess.Popen:
    """Worker 0 of a two-worker TF_CONFIG whose worker 1 never starts."""
    from bwopt.data.service import free_loopback_port

    ports = [free_loopback_port(), free_loopback_port()]
    process = subprocess.Popen(
        [sys.executable, "-m", "bwopt", *TWO_WORKERS, *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CONFIG": tf_config(ports=ports)},
    )
    process.ports = ports
    return process


@pytest.mark.slow
def test_a_task_that_never_starts_ends_the_wait_after_the_start_up_bound_naming_it(tmp_path):
    process = lone_worker(tmp_path, "cluster.startup_timeout_s=5")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 3 and "Traceback" not in stderr, stderr[-3000:]
    missing = f"127.0.0.1:{process.ports[1]}"
    assert f"bwopt: cluster task worker:1 at {missing} did not start within 5 s (cluster.startup_timeout_s)" in stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.timing
@pytest.mark.slow
def test_the_first_signal_stops_the_wait_for_a_task_that_never_starts(tmp_path):
    process = lone_worker(tmp_path, "cluster.startup_timeout_s=600")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:  # until it listens on its port and waits
        try:
            ports = {c.laddr.port for c in psutil.Process(process.pid).net_connections("inet") if c.status == "LISTEN"}
        except psutil.NoSuchProcess:
            break
        if process.ports[0] in ports:
            break
        time.sleep(0.1)
    assert process.poll() is None, process.communicate()[1][-3000:]
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    took_s = time.monotonic() - sent
    assert process.returncode == 143, stderr[-3000:]
    known_answer(took_s < 3, f"stopped {took_s:.1f} s after SIGTERM, bound 3 s")
    assert "bwopt: stopped by SIGTERM" in stderr and "Traceback" not in stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stopped_local_cluster_ends_the_chiefs_run_killed_with_what_it_measured(tmp_path, signum, code):
    """Ctrl-C, a scheduler's SIGTERM or a closed terminal's SIGHUP reaches the launcher; the chief
    stops at its next step and records, then the others stop."""
    process = start_bwopt(tmp_path, *MULTI_WORKER, "train.epochs=200", "train.warmup_steps=2", "measure.progress=false")
    for line in process.stdout:
        if line.startswith("epoch 2/"):
            break
    tasks = descendants(process)
    process.send_signal(signum)
    stdout, stderr, _, pids = watch(process, timeout_s=120)
    assert process.returncode == code and "Traceback" not in stderr, stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "KILLED" and summary["figures"]["num_timed_steps"] >= 2 * (22 - 2)
    assert (tmp_path / "run" / "checkpoint" / "state.json").is_file()
    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["run_id"])
    assert run.info.status == "KILLED" and run.data.tags["bwopt.end_reason"] == f"stopped by {signum.name}"
    assert_gone(pids | {task.pid for task in tasks})


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"task": {"type": "worker", "index": 0}}', 'TF_CONFIG has no "cluster" of jobs'),
        ('{"cluster": {"worker": "127.0.0.1:1"}, "task": {"type": "worker"}}', 'TF_CONFIG has no "cluster" of jobs'),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}}', 'TF_CONFIG has no "task"'),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": "0"}}', "task index '0'"),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": true}}', "task index True"),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": -1}}', "task index -1"),
    ],
)
def test_every_malformed_tf_config_names_what_is_wrong(monkeypatch, text, message):
    from bwopt.cluster import ClusterEnvironmentError, check_tf_config

    monkeypatch.setenv("TF_CONFIG", text)
    with pytest.raises(ClusterEnvironmentError, match=re.escape(message)):
        check_tf_config("tf_config")


@pytest.mark.parametrize(
    "procid, num_tasks, message",
    [
        ("x", "2", "SLURM_PROCID='x' is not a task count or rank"),
        ("0", "two", "SLURM_STEP_NUM_TASKS='two' is not a task count or rank"),
        ("2", "2", "SLURM_PROCID=2 is beyond SLURM_STEP_NUM_TASKS=2"),
    ],
)
def test_slurm_variables_that_do_not_describe_a_task_are_named(monkeypatch, procid, num_tasks, message):
    from bwopt.cluster import SLURM_VARIABLES, ClusterEnvironmentError, check_slurm

    for name in SLURM_VARIABLES:
        monkeypatch.setenv(name, "node1")
    monkeypatch.setenv("SLURM_PROCID", procid)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", num_tasks)
    strategy = validate(compose_config(["strategy=multi_worker_mirrored", "cluster=slurm"])).strategy
    with pytest.raises(ClusterEnvironmentError, match=re.escape(message)):
        check_slurm(strategy)
