"""Which processes run what: one process, a task of a cluster, or the launcher of a local cluster.

`launch` is the entry `bwopt.app.run_job` takes. With cluster=none the run is this process's;
with a cluster this process is one task of it (`run_task`: serve, or run the config; only the
chief logs to MLflow, the other tasks run with tracking off and write their summary.json); with
cluster=local outside a task, this process starts the cluster (`LocalLauncher`) and gathers the
tasks' figures into the chief's run (metrics `task/<type><index>/...`, cluster.json).

The local launcher starts each task as `python -m bwopt <overrides>` in its own process group
with `BWOPT_CLUSTER_TASK` and `TF_CONFIG` set; the task dies with the launcher
(PR_SET_PDEATHSIG). It polls the tasks: one that exits non-zero or by a signal fails the run at
once, with its name, its exit and the end of its log (when several end together, the one killed
by a signal is named: the others failed because it did), and the others are stopped (SIGTERM,
then SIGKILL after `cluster.stop_grace_s`). Ctrl-C, SIGTERM or SIGHUP of the launcher goes to the
chief first: it stops at its next step, while the other tasks wait for it in the step's
all-reduce, and ends its run KILLED with what it measured (summary.json, checkpoint, MLflow)
within `cluster.chief_stop_s`; then the others are stopped. A chief that died without ending its
MLflow run has it ended by the launcher (FAILED, or KILLED when stopped), with the reason. Its
servers listen on 127.0.0.1 only (bwopt.loopback).
"""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.cluster import TASK_ENV, ClusterError, PeerLost, check_environment, is_chief_task, serve, server_task
from bwopt.signals import STOP, die_with_this_process
from bwopt.summary import Summary

LOOPBACK_HOST = "127.0.0.1"
POLL_INTERVAL_S = 0.2
LOG_TAIL_LINES = 15
# After a task failed: how long the others get to show whether they failed first or because of it.
SETTLE_S = 1.0


def launch(config, output_dir: Path, resolved: dict, overrides: Sequence[str]) -> Optional[Summary]:
    """This process's part of the run: the run itself, a cluster task, or a local cluster's launcher."""
    if config.cluster.name == "local" and TASK_ENV not in os.environ:
        return LocalLauncher(config, output_dir, overrides).run()
    return run_task(config, output_dir, resolved, overrides)


def run_task(config, output_dir: Path, resolved: dict, overrides: Sequence[str]) -> Optional[Summary]:
    """Serve (parameter-server workers and ps) or run the config; a task other than the chief runs
    with tracking off, and its summary.json is what it reports."""
    from bwopt.modes import run
    from bwopt.schema import NoTracking

    if config.cluster.name == "none":
        return run(config, output_dir, resolved, overrides)
    check_environment(config.cluster, config.strategy)  # TF_CONFIG or SLURM's variables, before TensorFlow
    resolver = server_task(config)
    if resolver is not None:
        serve(resolver)
        return None
    if not is_chief_task(config):
        config = replace(config, tracking=NoTracking())
        resolved = {**resolved, "tracking": {"name": "none"}}
    try:
        return run(config, output_dir, resolved, overrides)
    except Exception as error:
        raise peer_failure(error) or error


def peer_failure(error: Exception) -> Optional[PeerLost]:
    """A TensorFlow error of the cluster's runtime (a peer task gone: its collective cancelled or
    unreachable) as one line, instead of gRPC's traceback; None for any other error."""
    if "tensorflow" not in sys.modules:  # it failed before TensorFlow started
        return None
    import tensorflow as tf

    from bwopt.data.diagnose import tensorflow_reason

    if not isinstance(error, (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError)):
        if not (isinstance(error, tf.errors.OpError) and "collective" in str(error).lower()):
            return None
    task = os.environ.get(TASK_ENV, "this task")
    return PeerLost(f"{task} lost a peer task of the cluster: {tensorflow_reason(error)}")


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
            KeyboardInterrupt: Ctrl-C, SIGTERM or SIGHUP; the chief first ends its run KILLED, then all are stopped.
        """
        from bwopt.loopback import loopback_preload

        preload = loopback_preload(self.config.cluster.allow_external_interfaces)
        try:
            with STOP.deferred():  # the first signal is seen between two polls, never inside Popen
                for task in self.tasks:
                    self.start(task, preload)
                self.wait()
        except BaseException as error:
            STOP.finishing = True  # a second signal stops the tasks at once; a third, the launcher
            try:
                if isinstance(error, KeyboardInterrupt):
                    self.stop_chief_first()
                self.stop_all()
                self.end_chief_run(error)
            finally:
                STOP.finishing = False
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
            preexec_fn=die_with_this_process(),  # no task trains on after its launcher was killed
        )
        log.close()

    def wait(self) -> None:
        """Until the run ends: every worker exited 0 (multi_worker_mirrored) or the chief did (parameter_server).

        Raises:
            ClusterError: a task ended otherwise; the root cause is named (see `first_failure`).
            KeyboardInterrupt: a stop signal.
        """
        finishers = [task for task in self.tasks if task.type in ("chief", "worker")]
        if self.config.strategy.name == "parameter_server":
            finishers = [self.chief]
        while True:
            STOP.check()
            if self.failed(finishers):
                time.sleep(SETTLE_S)  # the others fail in turn when a peer dies: see who went first
                task, code = self.first_failure(self.failed(finishers))
                raise ClusterError(self.failure_message(task, code))
            if all(task.process.poll() == 0 for task in finishers):
                return
            time.sleep(POLL_INTERVAL_S)

    def failed(self, finishers: List[Task]) -> List[tuple]:
        """(task, exit code) of every task that ended badly: non-zero, or a server that ended at all."""
        ended = [(task, task.process.poll()) for task in self.tasks]
        return [(task, code) for task, code in ended if code is not None and (code != 0 or task not in finishers)]

    @staticmethod
    def first_failure(failed: List[tuple]) -> tuple:
        """The root cause among tasks that ended together: one killed by a signal, else the first in order."""
        return min(failed, key=lambda item: item[1] >= 0)

    def failure_message(self, task: Task, code: int) -> str:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        message = f"cluster task {task.name} (pid {task.process.pid}) {how}; the other tasks were stopped"
        if task is not self.chief and task.log_path.exists():
            tail = task.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            message += f"\n--- end of {task.log_path} ---\n" + "\n".join(tail)
        return message

    def stop_chief_first(self) -> None:
        """On a stop signal: the chief alone, so that it stops at its next step while the others wait
        for it in the step's all-reduce, and ends its run KILLED with its records, within
        `cluster.chief_stop_s` (a second signal cuts the wait short)."""
        chief = self.chief.process
        if chief is None or chief.poll() is not None:
            return
        _signal_group(chief, signal.Signals[STOP.requested or "SIGINT"])
        deadline = time.monotonic() + self.config.cluster.chief_stop_s
        while chief.poll() is None and time.monotonic() < deadline and STOP.num_signals < 2:
            time.sleep(POLL_INTERVAL_S)

    def stop_all(self) -> None:
        """SIGTERM every task still running, then SIGKILL what is left after the grace period
        (at once on a second signal)."""
        running = [task.process for task in self.tasks if task.process is not None and task.process.poll() is None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + self.config.cluster.stop_grace_s
        while any(process.poll() is None for process in running) and time.monotonic() < deadline:
            if STOP.num_signals >= 2:
                break
            time.sleep(POLL_INTERVAL_S / 4)
        for process in running:
            _signal_group(process, signal.SIGKILL)  # also whatever a task started in its group
            process.wait()

    def read_summary(self, task: Task) -> Optional[dict]:
        path = self.task_dir(task) / "summary.json"
        return json.loads(path.read_text()) if path.exists() else None

    def end_chief_run(self, error: BaseException) -> None:
        """The chief's MLflow run ends FAILED (KILLED when stopped) with the reason. A chief that was
        stopped and ended its run KILLED itself keeps it as it is; one that died without ending it
        (no summary.json) has it found by its process id."""
        from bwopt.tracking import tracker_of_run
        from bwopt.tracking.runs import end_runs_of_process

        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        reason = (f"stopped by {STOP.requested}" if status == "KILLED" else str(error).splitlines()[0])[:5000]
        summary = self.read_summary(self.chief)
        if summary is None or not summary.get("run_id"):
            if self.chief.process is not None:
                end_runs_of_process(self.config.tracking, self.chief.process.pid, status, reason)
            return
        if status == "KILLED" and summary.get("status") == "KILLED":
            return
        tracker = tracker_of_run(self.config.tracking, summary["run_id"])
        tracker.set_tags({"bwopt.cluster_failure": reason, "bwopt.end_reason": reason})
        tracker.end(status)

    def gather(self) -> Summary:
        """The chief's Summary, with every other task's figures logged into the chief's run and cluster.json."""
        from bwopt.tracking import tracker_of_run

        reports = {task.name: self.read_summary(task) for task in self.tasks}
        chief = reports[self.chief.name]
        if chief is None:
            raise ClusterError(f"the chief {self.chief.name} ended without writing its summary.json")
        tasks = {task.name: {"address": task.address, "pid": task.process.pid} for task in self.tasks}
        cluster_report = {"tasks": tasks, "summaries": reports}
        (self.output_dir / "cluster.json").write_text(json.dumps(cluster_report, indent=2))
        metrics = task_metrics({name: report for name, report in reports.items() if name != self.chief.name})
        tracker = tracker_of_run(self.config.tracking, chief.get("run_id"))
        tracker.log_metrics(metrics)
        tracker.set_tags({"cluster_tasks": ", ".join(f"{name}@{task['address']}" for name, task in tasks.items())})
        tracker.log_artifacts(self.output_dir / "cluster.json")
        summary = Summary.from_dict(chief)
        summary.measurements = {**summary.measurements, **metrics}
        return summary


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


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
