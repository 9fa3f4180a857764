"""Runs that span processes: find the cluster (conf/cluster/), start a local one, gather its figures.

    cluster=none       one process (every single-host strategy)
    cluster=local      bwopt starts the tasks here, on free 127.0.0.1 ports, each with its TF_CONFIG
    cluster=tf_config  the tasks were started by someone else (Kubernetes TFJob, Vertex AI, by hand)
    cluster=slurm      the tasks are the srun tasks of a SLURM allocation (SlurmClusterResolver)

Every task runs the same config. Under multi_worker_mirrored every task is a worker and runs the
whole training (worker 0 is the chief); under parameter_server the chief runs the training and
schedules its steps on the workers, while `worker` and `ps` tasks only serve (`serve`). Only the
chief logs to MLflow; the other tasks run with tracking off and write their summary.json, which
the local launcher gathers into the chief's run (metrics `task/<type><index>/...`, cluster.json).

The local launcher (`LocalLauncher`) starts each task as `python -m bwopt <overrides>` in its own
process group with `BWOPT_CLUSTER_TASK` and `TF_CONFIG` set; the task dies with the launcher
(PR_SET_PDEATHSIG). It polls the tasks: one that exits non-zero or by a signal fails the run at
once, with its name, its exit and the end of its log, and the others are stopped (SIGTERM, then
SIGKILL after `cluster.stop_grace_s`). Ctrl-C or SIGTERM of the launcher stops them all the same way.

TensorFlow's gRPC servers bind every interface ("0.0.0.0:<port>" hard-coded, no bind address), so
the launcher preloads a 30-line library (`LOOPBACK_BIND_SOURCE`, built once with the C compiler)
that turns a wildcard `bind` into one on 127.0.0.1 (IPv6: ::ffff:127.0.0.1, which a dual-stack
socket accepts); without a compiler it refuses on a host with a non-loopback address unless
`cluster.allow_external_interfaces=true`.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# Set by the local launcher in each task's environment: "<type>:<index>".
TASK_ENV = "BWOPT_CLUSTER_TASK"
LOOPBACK_HOST = "127.0.0.1"
POLL_INTERVAL_S = 0.2
LOG_TAIL_LINES = 15


class ClusterError(RuntimeError):
    """A task of the cluster failed, or the cluster cannot be set up."""


# --- finding the cluster, in a task ---------------------------------------------------------


def resolve(cluster_config, strategy_config):
    """The tf.distribute cluster resolver of this task; None for cluster=none.

    Raises:
        ClusterError: cluster=local or tf_config without TF_CONFIG, or a cluster that lacks
            the tasks the strategy needs.
    """
    import tensorflow as tf

    if cluster_config.name == "none":
        return None
    if cluster_config.name == "slurm":
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=slurm_jobs(strategy_config, int(os.environ.get("SLURM_NTASKS", "1"))),
            port_base=cluster_config.port_base,
            gpus_per_node=cluster_config.gpus_per_node,
            gpus_per_task=cluster_config.gpus_per_task,
        )
    else:
        if not os.environ.get("TF_CONFIG"):
            raise ClusterError(
                f"cluster={cluster_config.name} needs the TF_CONFIG environment variable "
                '(e.g. {"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}})'
            )
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    check_tasks(resolver.cluster_spec().as_dict(), strategy_config)
    return resolver


def slurm_jobs(strategy_config, num_tasks: int) -> Dict[str, int]:
    """How the srun tasks of an allocation become TensorFlow tasks (the first ones first)."""
    if strategy_config.name == "parameter_server":
        return {"chief": 1, "ps": strategy_config.num_ps, "worker": num_tasks - 1 - strategy_config.num_ps}
    return {"worker": num_tasks}


def check_tasks(cluster_spec: Dict[str, list], strategy_config) -> None:
    """The cluster has the tasks the strategy needs."""
    if not cluster_spec.get("worker"):
        raise ClusterError(f"the cluster has no worker task: {cluster_spec}")
    if strategy_config.name == "parameter_server":
        if len(cluster_spec.get("ps", [])) != strategy_config.num_ps or len(cluster_spec.get("chief", [])) != 1:
            raise ClusterError(
                f"strategy=parameter_server with strategy.num_ps={strategy_config.num_ps} needs one chief "
                f"and {strategy_config.num_ps} ps task(s); the cluster has {cluster_spec}"
            )


def task_name(resolver) -> str:
    return f"{resolver.task_type}:{resolver.task_id}"


def is_chief(resolver) -> bool:
    """The task that logs: the chief, or worker 0 of a cluster without one (TensorFlow's convention)."""
    has_chief = bool(resolver.cluster_spec().as_dict().get("chief"))
    return resolver.task_type == "chief" or (not has_chief and resolver.task_type == "worker" and resolver.task_id == 0)


def describe(resolver) -> str:
    """Every task of the cluster and its address: the processes that took part."""
    tasks = resolver.cluster_spec().as_dict()
    return ", ".join(f"{job}:{index}@{address}" for job in sorted(tasks) for index, address in enumerate(tasks[job]))


def serve(resolver) -> None:
    """A parameter-server cluster's worker or ps task: start TensorFlow's server, serve until stopped."""
    import tensorflow as tf

    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"bwopt: {task_name(resolver)} serving at {server.target}", flush=True)
    server.join()


# --- a run in a cluster: the entry app.run_job takes when cluster != none ---------------------


def run_in_cluster(config, output_dir: Path, resolved: dict, overrides: Sequence[str]):
    """cluster=local outside a task: start the cluster; otherwise: be this task of it."""
    if config.cluster.name == "local" and TASK_ENV not in os.environ:
        return LocalLauncher(config, output_dir, overrides).run()
    return run_task(config, output_dir, resolved, overrides)


def run_task(config, output_dir: Path, resolved: dict, overrides: Sequence[str]):
    """This process's part: serve (parameter-server workers and ps) or run the config.

    A task other than the chief runs with tracking off; its summary.json is what it reports.
    """
    from dataclasses import replace

    from bwopt.run import run
    from bwopt.schema import NoTracking

    if config.strategy.name == "parameter_server":
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        if config.cluster.name == "slurm":
            resolver = resolve(config.cluster, config.strategy)
        if resolver.task_type in ("worker", "ps"):
            serve(resolver)
            return None
    if not _is_chief_task(config):
        config = replace(config, tracking=NoTracking())
        resolved = {**resolved, "tracking": {"name": "none"}}
    return run(config, output_dir, resolved, overrides)


def _is_chief_task(config) -> bool:
    """Whether this process is the chief, from SLURM's task id or TF_CONFIG (before TensorFlow starts)."""
    if config.cluster.name == "slurm":
        return os.environ.get("SLURM_PROCID", "0") == "0"
    settings = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task, cluster = settings.get("task", {}), settings.get("cluster", {})
    if cluster.get("chief"):
        return task.get("type") == "chief"
    return task.get("type", "worker") == "worker" and int(task.get("index", 0)) == 0


# --- the local launcher -----------------------------------------------------------------------


@dataclass
class Task:
    type: str
    index: int
    address: str
    process: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"


def local_tasks(strategy_config, num_workers: int, ports: Sequence[int]) -> List[Task]:
    """The tasks of a local cluster, one port each: workers, plus a chief and ps tasks under parameter_server."""
    kinds = [("worker", index) for index in range(num_workers)]
    if strategy_config.name == "parameter_server":
        kinds = [("chief", 0), *[("ps", index) for index in range(strategy_config.num_ps)], *kinds]
    return [Task(kind, index, f"{LOOPBACK_HOST}:{port}") for (kind, index), port in zip(kinds, ports)]


def tf_config(tasks: Sequence[Task], task: Task) -> str:
    cluster: Dict[str, List[str]] = {}
    for each in tasks:
        cluster.setdefault(each.type, []).append(each.address)
    return json.dumps({"cluster": cluster, "task": {"type": task.type, "index": task.index}})


class LocalLauncher:
    """Starts a local cluster's tasks, watches them, stops them all, gathers their figures."""

    def __init__(self, config, output_dir: Path, overrides: Sequence[str]) -> None:
        from bwopt.data.service import free_loopback_port

        self.config = config
        self.output_dir = output_dir
        self.overrides = list(overrides)
        strategy = config.strategy
        num_tasks = config.cluster.num_workers + (1 + strategy.num_ps if strategy.name == "parameter_server" else 0)
        self.tasks = local_tasks(strategy, config.cluster.num_workers, [free_loopback_port() for _ in range(num_tasks)])

    @property
    def chief(self) -> Task:
        return self.tasks[0]  # chief, or worker 0

    def task_dir(self, task: Task) -> Path:
        return self.output_dir if task is self.chief else self.output_dir / "tasks" / f"{task.type}-{task.index}"

    def run(self):
        """Start every task, wait for the run to end; returns the chief's Summary.

        Raises:
            ClusterError: a task failed (named, with the end of its log); all tasks are stopped.
            KeyboardInterrupt: Ctrl-C or SIGTERM; all tasks are stopped.
        """
        from bwopt.signals import STOP

        preload = loopback_preload(self.config.cluster.allow_external_interfaces)
        try:
            for task in self.tasks:
                self.start(task, preload)
            self.wait(STOP)
        except BaseException as error:
            self.stop_all()
            self.mark_chief_failed(error)
            raise
        self.stop_all()  # parameter-server workers and ps serve until told
        return self.gather()

    def start(self, task: Task, preload: Optional[str]) -> None:
        directory = self.task_dir(task)
        directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, TASK_ENV: task.name, "TF_CONFIG": tf_config(self.tasks, task)}
        if preload:
            env["LD_PRELOAD"] = " ".join(filter(None, [preload, os.environ.get("LD_PRELOAD")]))
        command = [sys.executable, "-m", "bwopt", *self.overrides, f"hydra.run.dir={directory}"]
        task.log_path = self.output_dir / "tasks" / f"{task.type}-{task.index}.log"
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = task.log_path.open("w")
        # The chief talks to the terminal, as a one-process run does; the others to their logs.
        output = None if task is self.chief else log
        task.process = subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=output,
            start_new_session=True,  # Ctrl-C reaches the launcher, which stops every task in order
            preexec_fn=_die_with_parent,
        )
        log.close()

    def wait(self, stop) -> None:
        """Until the run ends: every worker exited 0 (multi_worker_mirrored) or the chief did (parameter_server)."""
        finishers = [task for task in self.tasks if task.type in ("chief", "worker")]
        if self.config.strategy.name == "parameter_server":
            finishers = [self.chief]
        while True:
            stop.check()
            for task in self.tasks:
                code = task.process.poll()
                if code is not None and (code != 0 or task not in finishers):
                    raise ClusterError(self.failure_message(task, code))
            if all(task.process.poll() == 0 for task in finishers):
                return
            time.sleep(POLL_INTERVAL_S)

    def failure_message(self, task: Task, code: int) -> str:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        message = f"cluster task {task.name} (pid {task.process.pid}) {how}; the other tasks were stopped"
        if task is not self.chief and task.log_path.exists():
            tail = task.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            message += f"\n--- end of {task.log_path} ---\n" + "\n".join(tail)
        return message

    def stop_all(self) -> None:
        """SIGTERM every task still running, then SIGKILL what is left after the grace period."""
        running = [task.process for task in self.tasks if task.process is not None and task.process.poll() is None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + self.config.cluster.stop_grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in running:
            _signal_group(process, signal.SIGKILL)  # also whatever a task started in its group
            process.wait()

    def read_summary(self, task: Task) -> Optional[dict]:
        path = self.task_dir(task) / "summary.json"
        return json.loads(path.read_text()) if path.exists() else None

    def mark_chief_failed(self, error: BaseException) -> None:
        """The chief's MLflow run ends FAILED (KILLED on Ctrl-C) with the reason, whatever status it gave itself."""
        summary = self.read_summary(self.chief)
        if not summary or not summary.get("run_id") or self.config.tracking.name != "mlflow":
            return
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        with _quiet_failure("mark the chief's MLflow run"):
            client = _mlflow_client(self.config.tracking)
            client.set_tag(summary["run_id"], "bwopt.cluster_failure", str(error)[:5000])
            client.set_terminated(summary["run_id"], status)

    def gather(self):
        """The chief's Summary, with every other task's figures logged into the chief's run and cluster.json."""
        from bwopt.measure import TimingFigures
        from bwopt.run import Summary

        reports = {task.name: self.read_summary(task) for task in self.tasks}
        chief = reports[self.chief.name]
        if chief is None:
            raise ClusterError(f"the chief {self.chief.name} ended without writing its summary.json")
        tasks = {task.name: {"address": task.address, "pid": task.process.pid} for task in self.tasks}
        cluster_report = {"tasks": tasks, "summaries": reports}
        (self.output_dir / "cluster.json").write_text(json.dumps(cluster_report, indent=2))
        metrics = task_metrics({name: report for name, report in reports.items() if name != self.chief.name})
        if chief.get("run_id") and self.config.tracking.name == "mlflow":
            with _quiet_failure("log the other tasks' figures"):
                from mlflow.entities import Metric, RunTag

                client = _mlflow_client(self.config.tracking)
                now = int(time.time() * 1000)
                client.log_batch(
                    chief["run_id"],
                    metrics=[Metric(key, value, now, 0) for key, value in metrics.items()],
                    tags=[RunTag("cluster_tasks", ", ".join(f"{n}@{t['address']}" for n, t in tasks.items()))],
                )
                client.log_artifact(chief["run_id"], str(self.output_dir / "cluster.json"))
        figures = chief.get("figures")
        known = set(TimingFigures.__dataclass_fields__)
        return Summary(
            run_id=chief.get("run_id"),
            status=chief["status"],
            mode=chief["mode"],
            num_replicas=chief.get("num_replicas", 0),
            devices=chief.get("devices", []),
            figures=TimingFigures(**{k: v for k, v in figures.items() if k in known}) if figures else None,
            measurements={**chief.get("measurements", {}), **metrics},
            final_metrics=chief.get("final_metrics", {}),
            recommendation=chief.get("recommendation"),
        )


# Figures of the other tasks that the chief's run gets, per task.
GATHERED_FIGURES = ("throughput_examples_per_s", "step_time_p50_s", "input_wait_fraction", "num_timed_steps")


def task_metrics(reports: Dict[str, Optional[dict]]) -> Dict[str, float]:
    """`task/<type><index>/<figure>` metrics of the tasks that reported figures (servers report none)."""
    metrics = {}
    for name, report in reports.items():
        figures = (report or {}).get("figures") or {}
        for key in GATHERED_FIGURES:
            if key in figures:
                metrics[f"task/{name.replace(':', '')}/{key}"] = float(figures[key])
    return metrics


def _mlflow_client(tracking_config):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_config.uri)


class _quiet_failure:
    """A tracking error after the run is reported on stderr and never hides the run's own outcome."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            print(f"bwopt: warning: could not {self.what}: {exc!r}", file=sys.stderr)
            return True
        return False


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the launcher dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# --- binding TensorFlow's servers to 127.0.0.1 ----------------------------------------------

LOOPBACK_BIND_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

/* bwopt: a bind() to the wildcard address binds to loopback instead (TensorFlow's gRPC servers
   hard-code 0.0.0.0). IPv6 wildcards become ::ffff:127.0.0.1, which a dual-stack socket accepts. */
int bind(int fd, const struct sockaddr *address, socklen_t length) {
  static int (*real_bind)(int, const struct sockaddr *, socklen_t);
  if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
  if (address && address->sa_family == AF_INET && length >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in copy;
    memcpy(&copy, address, sizeof copy);
    if (copy.sin_addr.s_addr == htonl(INADDR_ANY)) {
      copy.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
    }
  }
  if (address && address->sa_family == AF_INET6 && length >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 copy;
    memcpy(&copy, address, sizeof copy);
    if (IN6_IS_ADDR_UNSPECIFIED(&copy.sin6_addr)) {
      memset(&copy.sin6_addr, 0, sizeof copy.sin6_addr);
      copy.sin6_addr.s6_addr[10] = 0xff;
      copy.sin6_addr.s6_addr[11] = 0xff;
      copy.sin6_addr.s6_addr[12] = 127;
      copy.sin6_addr.s6_addr[15] = 1;
      return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
    }
  }
  return real_bind(fd, address, length);
}
"""


def loopback_preload(allow_external_interfaces: bool) -> Optional[str]:
    """Path of the loopback-bind library, built on first use; None where no compiler is found
    and the host (or its network namespace) has only loopback addresses, or external interfaces
    are allowed.

    Raises:
        ClusterError: no compiler, a non-loopback address, and external interfaces not allowed.
    """
    digest = hashlib.sha256(LOOPBACK_BIND_SOURCE.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bwopt"
    library = cache / f"loopback_bind-{digest}.so"
    if library.exists():
        return str(library)
    error = _build_library(LOOPBACK_BIND_SOURCE, library)
    if error is None:
        return str(library)
    from bwopt.data.service import non_loopback_addresses

    external = non_loopback_addresses()
    if external and not allow_external_interfaces:
        raise ClusterError(
            f"cluster=local: TensorFlow's servers would listen on every interface ({', '.join(external)}) "
            f"and the loopback-bind library could not be built ({error}); install a C compiler (cc), "
            "run inside a loopback-only network namespace, or set cluster.allow_external_interfaces=true"
        )
    return None


def _build_library(source: str, library: Path) -> Optional[str]:
    """Compile `source` into `library` (atomically); the error text, or None when built."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as folder:
        source_path, built = Path(folder) / "library.c", Path(folder) / "library.so"
        source_path.write_text(source)
        compiler = os.environ.get("CC", "cc")
        try:
            result = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source_path), "-ldl"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{compiler}: {error}"
        if result.returncode != 0:
            return f"{compiler} failed: {result.stderr.strip()[:500]}"
        os.replace(built, library)
    return None


# --- scaling ---------------------------------------------------------------------------------


def _main() -> None:
    """`python -m bwopt.cluster DIR`: the scaling efficiency of the jobs of a sweep folder."""
    from bwopt.measure.scaling import scaling_efficiency

    folder = Path(sys.argv[1])
    summaries = [json.loads(path.read_text()) for path in sorted(folder.glob("*/summary.json"))]
    for replicas, efficiency in scaling_efficiency(summaries).items():
        print(f"{replicas:>3} replica(s)  scaling efficiency {efficiency:.1%}")


if __name__ == "__main__":
    _main()
