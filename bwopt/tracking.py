"""Experiment tracking: an MLflow run per experiment, or nothing.

A tracker that fails while logging during a measurement warns on stderr and goes on: the
measurement is still printed and written to the run folder, and `python -m bwopt.tracking
complete RUN_FOLDER` completes the MLflow run from it later. Every wait on the store is bounded:
a store that cannot be reached at the start stops the run within seconds with a message naming
`tracking.uri` (`TrackingUnavailable`); during the run an HTTP call gives up after
`HTTP_TIMEOUT_S` x (1 + `HTTP_MAX_RETRIES`) seconds at most.
"""

import contextlib
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from bwopt.redact import redact, redact_text

MLFLOW_PARAMS_PER_BATCH = 100
# Bounded waits on an HTTP tracking server (MLflow's defaults retry for minutes); the user's own
# MLFLOW_HTTP_REQUEST_* variables win.
START_TIMEOUT_S = 5
HTTP_TIMEOUT_S = 10
HTTP_MAX_RETRIES = 2
STORE_LOCK_TIMEOUT_S = 120


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be used: nothing was measured yet, so the run does not start."""


# The sweep launcher (bwopt.sweep) passes its parent run to each job's process.
PARENT_RUN_ENV = "BWOPT_PARENT_RUN_ID"
EXPERIMENT_DESCRIPTION = (
    "bwopt runs: each is one data-parallel TensorFlow training (or input / inference) measurement. "
    "Its name is its command-line overrides; its description holds the summary, the verdict and the "
    "recommendation; a sweep is a parent run with one child run per job."
)


def flatten(tree: dict, prefix: str = "") -> Dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}: the resolved config as MLflow params."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def sqlite_path(uri: str) -> Optional[Path]:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def check_store(uri: str) -> None:
    """Fail fast, naming tracking.uri, when the store cannot work: a sqlite file that cannot be written,
    an HTTP server that does not answer within START_TIMEOUT_S. Sets MLflow's HTTP bounds."""
    database = sqlite_path(uri)
    if database is not None:
        folder = database.parent if database.parent != Path("") else Path(".")
        folder = next((parent for parent in (folder, *folder.parents) if parent.exists()), Path("."))
        target = database if database.exists() else folder
        if database.is_dir() or not folder.is_dir() or not os.access(target, os.W_OK):
            raise TrackingUnavailable(
                f"tracking.uri={redact_text(uri)}: {target} is not writable; point tracking.uri at a writable place"
            )
        return
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_MAX_RETRIES))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=START_TIMEOUT_S).close()
        except (urllib.error.URLError, OSError) as error:
            raise TrackingUnavailable(
                f"tracking.uri={redact_text(uri)}: the tracking server did not answer within {START_TIMEOUT_S} s "
                f"({redact_text(str(error))}); "
                "start it, or use tracking.uri=sqlite:///outputs/mlflow.db or tracking=none"
            ) from None


@contextlib.contextmanager
def store_lock(uri: str):
    """One process at a time creates or migrates a sqlite store and its experiment.

    MLflow migrates a new sqlite store on first use; runs started together on a new store would
    race in that migration ("table ... already exists") and in creating the experiment.
    """
    database = sqlite_path(uri)
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        deadline = time.monotonic() + STORE_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingUnavailable(
                        f"tracking.uri={redact_text(uri)}: another process held {database}.lock "
                        f"for {STORE_LOCK_TIMEOUT_S} s"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def reap_dead_runs(client, experiment_ids: Sequence[str]) -> list:
    """Mark KILLED the RUNNING runs of this host whose process is gone (kill -9, the OOM killer).

    A run records its host and pid (`bwopt.host`, `bwopt.pid`); a pid that no longer exists, or now
    belongs to a process younger than the run, means the run's process died without ending it.
    Runs of other hosts are left alone: their processes cannot be checked from here.
    """
    import psutil

    host = socket.gethostname()
    query = f"attributes.status = 'RUNNING' and tags.`bwopt.host` = '{host}'"
    reaped = []
    for run in client.search_runs(list(experiment_ids), query, max_results=1000):
        pid = int(run.data.tags.get("bwopt.pid", "0") or 0)
        try:
            alive = psutil.Process(pid).create_time() * 1000 <= run.info.start_time + 1000
        except (psutil.NoSuchProcess, ValueError):
            alive = False
        if not alive:
            client.set_tag(run.info.run_id, "bwopt.end_reason", f"process {pid} on {host} was gone")
            client.set_terminated(run.info.run_id, "KILLED")
            reaped.append(run.info.run_id)
    return reaped


def sqlite_artifact_location(uri: str) -> Optional[str]:
    """For a sqlite store, keep artifacts in `mlartifacts/` beside the database file."""
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri[len("sqlite:///") :])
    database.parent.mkdir(parents=True, exist_ok=True)
    return (database.parent.resolve() / "mlartifacts").as_uri()


def shown_overrides(overrides: Sequence[str]) -> list:
    """The overrides that say what a run measured: Hydra's own and tracking's are left out."""
    return [item for item in overrides if not item.lstrip("+~").startswith(("hydra.", "hydra/", "tracking"))]


def run_name(overrides: Sequence[str]) -> str:
    """'pipeline.prefetch=10,strategy=mirrored' from the overrides, 'default' when there are none."""
    return ",".join(shown_overrides(overrides)) or "default"


def run_tags(overrides: Sequence[str]) -> Dict[str, str]:
    """Tags every bwopt run carries: the overrides (one tag each), the host and pid, the sweep's parent."""
    tags = {"bwopt.overrides": " ".join(shown_overrides(overrides)), "bwopt.host": socket.gethostname()}
    tags["bwopt.pid"] = str(os.getpid())
    for item in shown_overrides(overrides):
        key, _, value = item.lstrip("+~").partition("=")
        tags[f"override.{key}"] = value
    if os.environ.get(PARENT_RUN_ENV):
        tags["mlflow.parentRunId"] = os.environ[PARENT_RUN_ENV]
    return tags


# MLflow's UI shows two decimals: figures go there in units that read well, named in the key.
# summary.json keeps seconds, bytes and fractions. Rules by key suffix, the first match wins.
MIB = 2**20
READABLE_UNITS = (
    ("_bytes_per_s", "_mib_per_s", 1 / MIB),
    ("_examples_per_s", "_examples_per_s", 1.0),
    ("_bytes", "_mib", 1 / MIB),
    ("_fraction", "_pct", 100.0),
)
MILLISECOND_FIGURES = ("step_time_", "_latency_")  # ..._s of these are per-step times: milliseconds


def readable_metrics(figures: Dict[str, float]) -> Dict[str, float]:
    """Figures as MLflow metrics: step times in ms, bytes in MiB, fractions in % (see README)."""
    metrics = {}
    for key, value in figures.items():
        name, scale = key, 1.0
        if key == "efficiency":
            name, scale = "efficiency_pct", 100.0
        elif key.endswith("_s") and not key.endswith("_per_s") and any(part in key for part in MILLISECOND_FIGURES):
            name, scale = key[: -len("_s")] + "_ms", 1e3
        else:
            for suffix, readable, factor in READABLE_UNITS:
                if key.endswith(suffix):
                    name, scale = key[: -len(suffix)] + readable, factor
                    break
        metrics[name] = float(value) * scale
    return metrics


class MlflowTracker:
    def __init__(self, config) -> None:
        self.config = config
        self.client = None
        self.run_id: Optional[str] = None
        self.system_metrics = None  # MLflow's SystemMetricsMonitor, while the run lasts

    def start(
        self, params: Dict[str, str], tags: Dict[str, str], overrides: Sequence[str] = (), resume: Optional[str] = None
    ) -> str:
        """Create the run, named from `overrides` unless tracking.run_name is set, with MLflow's
        own source tags (source name and type, user, git commit), as its fluent API sets them;
        or, with `resume`, reopen that run (a stopped run continued: bwopt.checkpoint). A signal
        while the store is slow to answer stops at once."""
        from bwopt.signals import STOP

        with STOP.interruptible():
            return self._start(params, tags, overrides, resume)

    def _start(self, params, tags, overrides, resume) -> str:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag
        from mlflow.tracking.context.registry import resolve_tags

        check_store(self.config.uri)
        with store_lock(self.config.uri):  # creating the client migrates a new store
            self.client = MlflowClient(tracking_uri=self.config.uri)
            experiment = self.client.get_experiment_by_name(self.config.experiment)
            if experiment is None:
                experiment_id = self.client.create_experiment(
                    self.config.experiment,
                    artifact_location=sqlite_artifact_location(self.config.uri),
                    tags={"mlflow.note.content": EXPERIMENT_DESCRIPTION},
                )
            else:
                experiment_id = experiment.experiment_id
        self._guarded("mark runs of dead processes KILLED", lambda: reap_dead_runs(self.client, [experiment_id]))
        if resume is not None:
            self.run_id = resume
            self.client.update_run(resume, status="RUNNING")
            self.client.log_batch(resume, tags=[RunTag(key, str(value)) for key, value in run_tags(overrides).items()])
            if self.config.system_metrics:
                self._guarded("start system metrics", self._start_system_metrics)
            return resume
        tags = resolve_tags({**run_tags(overrides), **redact(dict(self.config.tags)), **tags})
        name = self.config.run_name or run_name(overrides)
        run = self.client.create_run(experiment_id, run_name=name, tags=tags)
        self.run_id = run.info.run_id
        items = [Param(key, value) for key, value in params.items()]
        try:
            for start in range(0, len(items), MLFLOW_PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=items[start : start + MLFLOW_PARAMS_PER_BATCH])
        except BaseException:
            self.end("FAILED")  # never leave a run RUNNING
            raise
        if self.config.system_metrics:
            self._guarded("start system metrics", self._start_system_metrics)
        return self.run_id

    def _start_system_metrics(self) -> None:
        """MLflow's own sampler of CPU, memory, disk, network (and GPU) use, as `system/...` metrics."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.system_metrics = SystemMetricsMonitor(
            self.run_id, sampling_interval=self.config.system_metrics_interval_s, tracking_uri=self.config.uri
        )
        self.system_metrics.start()

    def _finish_system_metrics(self) -> None:
        monitor, self.system_metrics = self.system_metrics, None
        monitor.finish()
        if monitor._logging_step == 0:  # shorter than one interval: log what it sampled, once
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()

    def _guarded(self, what: str, action) -> None:
        from bwopt.signals import STOP

        try:
            with STOP.interruptible():  # a store that hangs must not hold a stop back
                action()
        except Exception as error:  # a tracking outage must not end the measurement
            print(f"bwopt: warning: MLflow could not {what}: {redact_text(str(error))}", file=sys.stderr)

    def log_metrics(self, metrics: Dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        self._guarded("log metrics", lambda: self.client.log_batch(self.run_id, metrics=batch))

    def set_tags(self, tags: Dict[str, str]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(key, str(value)) for key, value in tags.items()]
        self._guarded("set tags", lambda: self.client.log_batch(self.run_id, tags=batch))

    def log_artifacts(self, path: Path, artifact_path: Optional[str] = None) -> None:
        if path.is_dir():
            self._guarded("log artifacts", lambda: self.client.log_artifacts(self.run_id, str(path), artifact_path))
        elif path.is_file():
            self._guarded("log an artifact", lambda: self.client.log_artifact(self.run_id, str(path), artifact_path))

    def set_description(self, markdown: str) -> None:
        """The run's description in MLflow's UI."""
        self.set_tags({"mlflow.note.content": markdown})

    def end(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        if self.system_metrics is not None:
            self._guarded("log system metrics", self._finish_system_metrics)
        self._guarded("end the run", lambda: self.client.set_terminated(self.run_id, status))


class NoTracker:
    run_id: Optional[str] = None

    def start(
        self, params: Dict[str, str], tags: Dict[str, str], overrides: Sequence[str] = (), resume: Optional[str] = None
    ) -> Optional[str]:
        return None

    def log_metrics(self, metrics: Dict[str, float], step: int = 0) -> None:
        pass

    def set_tags(self, tags: Dict[str, str]) -> None:
        pass

    def set_description(self, markdown: str) -> None:
        pass

    def log_artifacts(self, path: Path, artifact_path: Optional[str] = None) -> None:
        pass

    def end(self, status: str) -> None:
        pass


# Keyed by the options of conf/tracking/ (bwopt.schema.SCHEMAS["tracking"]).
TRACKERS = {"mlflow": MlflowTracker, "none": lambda config: NoTracker()}


def build_tracker(config):
    return TRACKERS[config.name](config)


def complete(run_folder: Path) -> str:
    """Log a run folder's summary.json to its MLflow run (after a tracking outage) and end it with
    the status the run had; returns the run id. The store is the run's own `tracking.uri`."""
    import json

    from mlflow import MlflowClient
    from omegaconf import OmegaConf

    summary = json.loads((run_folder / "summary.json").read_text())
    config_file = run_folder / ".hydra" / "config.yaml"
    config = OmegaConf.load(config_file if config_file.exists() else run_folder / "config.yaml")
    client = MlflowClient(tracking_uri=config.tracking.uri)
    figures = {  # the numbers the run measured (unmeasured ones are null)
        key: value for key, value in (summary["figures"] or {}).items() if isinstance(value, (int, float))
    }
    metrics = readable_metrics({**figures, **summary["measurements"]})
    tracker = MlflowTracker(config.tracking)
    tracker.client, tracker.run_id = client, summary["run_id"]
    tracker.log_metrics(metrics)
    if summary["final_metrics"]:  # the last epoch's, at its number as printed
        tracker.log_metrics(summary["final_metrics"], step=int(config.train.epochs))
    tracker.log_artifacts(run_folder / "summary.json")
    tracker.log_artifacts(run_folder / "plots", "plots")
    client.set_terminated(summary["run_id"], summary["status"])
    return summary["run_id"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m bwopt.tracking reap URI [EXPERIMENT]` | `python -m bwopt.tracking complete RUN_FOLDER`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bwopt.tracking", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    reap = commands.add_parser("reap", help="mark RUNNING runs of dead processes on this host KILLED")
    reap.add_argument("tracking_uri")
    reap.add_argument("experiment", nargs="?", default="bwopt")
    finish = commands.add_parser("complete", help="log a run folder's summary.json to its MLflow run")
    finish.add_argument("run_folder", type=Path)
    arguments = parser.parse_args(argv)
    if arguments.command == "complete":
        print(f"bwopt: completed MLflow run {complete(arguments.run_folder)}")
        return 0
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=arguments.tracking_uri)
    experiment = client.get_experiment_by_name(arguments.experiment)
    reaped = reap_dead_runs(client, [experiment.experiment_id]) if experiment else []
    print(f"bwopt: marked {len(reaped)} run(s) KILLED" + "".join(f"\n  {run_id}" for run_id in reaped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
