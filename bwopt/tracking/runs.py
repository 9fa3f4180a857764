"""One experiment's MLflow run (`MlflowTracker`), or none (`NoTracker`), and what is done to a run
after its process: completing it from its run folder, ending it, adding what other processes measured."""

import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.redact import redact
from bwopt.tracking.names import NOTE_TAG, readable_metrics, run_name, run_tags
from bwopt.tracking.preflight import check_store, server_uri, start_bounds
from bwopt.tracking.store import client_for, guarded, open_client, reap_dead_runs, signal_safe, unavailable_on_error

MLFLOW_PARAMS_PER_BATCH = 100
# Tags of how a run ended, which a resumed run must not keep from its stopped attempt.
END_TAGS = ("bwopt.end_reason", "bwopt.cluster_failure")


class MlflowTracker:
    def __init__(self, config) -> None:
        self.config = config
        self.client = None
        self.run_id: Optional[str] = None
        self.system_metrics = None  # MLflow's SystemMetricsMonitor, while the run lasts
        self.failures: List[str] = []  # what the store failed to take (`guarded`), in order

    def check(self) -> None:
        """Fail fast when the store cannot work (bwopt.tracking.preflight.check_store): it needs neither
        MLflow nor TensorFlow, so a run checks it before either is imported.

        Raises:
            TrackingUnavailable: one line naming tracking.uri.
        """
        check_store(self.config.uri)

    def start(
        self, params: Dict[str, str], tags: Dict[str, str], overrides: Sequence[str] = (), resume: Optional[str] = None
    ) -> str:
        """Create the run, named from `overrides` unless tracking.run_name is set, with MLflow's
        own source tags (source name and type, user, git commit), as its fluent API sets them;
        or, with `resume`, reopen that run (a stopped run continued: bwopt.checkpoint), without the
        tags of how its stopped attempt ended. A signal while a server is slow to answer stops at
        once, one during a local store's call once the call is done (`signal_safe`); each call to
        a server gives up after bwopt.tracking.preflight.START_TIMEOUT_S.

        Raises:
            TrackingUnavailable: the store failed (one line naming tracking.uri); a run it had made
                already is deleted, so nothing half-written is left (so it is when a signal stops
                the start).
        """
        try:
            with signal_safe(self.config.uri), start_bounds(self.config.uri):
                return self._start(params, tags, overrides, resume)
        except BaseException:  # a signal or a store that failed: a run it had made measured nothing
            if resume is None and self.run_id is not None:
                self._drop_new_run()
            raise

    def _drop_new_run(self) -> None:
        monitor, self.system_metrics = self.system_metrics, None
        if monitor is not None:
            with guarded(self.config.uri, "stop system metrics"):
                monitor.finish()
        with guarded(self.config.uri, "delete the run it had begun"):
            self.client.delete_run(self.run_id)
        self.run_id = None

    def _start(self, params, tags, overrides, resume) -> str:
        from mlflow.tracking.context.registry import resolve_tags

        self.client, experiment_id = open_client(self.config)
        with guarded(self.config.uri, "mark runs of dead processes KILLED"):
            reap_dead_runs(self.client, [experiment_id])
        if resume is not None:
            with unavailable_on_error(self.config.uri):
                self._reopen(resume, overrides, params)
            self._start_system_metrics()
            return resume
        tags = resolve_tags({**run_tags(overrides), **redact(dict(self.config.tags)), **tags})
        name = self.config.run_name or run_name(overrides)
        with unavailable_on_error(self.config.uri):
            self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
            self._log_params(params)
        self._start_system_metrics()
        return self.run_id

    def _log_params(self, params: Dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + MLFLOW_PARAMS_PER_BATCH])

    def _reopen(self, run_id: str, overrides: Sequence[str], params: Dict[str, str]) -> None:
        """A stopped run, RUNNING again: this process's tags, the stopped attempt's end tags removed.

        MLflow's params cannot change, so a value that may change on resuming (`train.epochs`,
        `measure.*`: bwopt.checkpoint.MAY_CHANGE) and did is kept as the tag
        `bwopt.resumed_with.<key>`, beside the param the run started with."""
        from mlflow.entities import RunTag

        self.run_id = run_id
        run = self.client.get_run(run_id)
        stale = [key for key in END_TAGS if key in run.data.tags]
        self.client.update_run(run_id, status="RUNNING")
        for key in stale:
            self.client.delete_tag(run_id, key)
        tags = dict(run_tags(overrides))
        for key, value in params.items():
            if key in run.data.params and run.data.params[key] != str(value):
                tags[f"bwopt.resumed_with.{key}"] = value
        self.client.log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])

    def last_logged_step(self, key: str) -> int:
        """The highest step of metric `key` in the run (0 when it has none, or the store does not answer)."""
        with guarded(self.config.uri, f"read back {key}"):
            return max((metric.step for metric in self.client.get_metric_history(self.run_id, key)), default=0)
        return 0

    def _start_system_metrics(self) -> None:
        """MLflow's own sampler of CPU, memory, disk, network (and GPU) use, as `system/...` metrics."""
        if not self.config.system_metrics:
            return
        with guarded(self.config.uri, "start system metrics", self.failures):
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self.system_metrics = SystemMetricsMonitor(
                self.run_id,
                sampling_interval=self.config.system_metrics_interval_s,
                tracking_uri=server_uri(self.config.uri),
            )
            self.system_metrics.start()

    def _finish_system_metrics(self) -> None:
        monitor, self.system_metrics = self.system_metrics, None
        monitor.finish()
        if monitor._logging_step == 0:  # shorter than one interval: log what it sampled, once
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()

    def log_metrics(self, metrics: Dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        with guarded(self.config.uri, "log metrics", self.failures):
            self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Dict[str, str]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(key, str(value)) for key, value in tags.items()]
        with guarded(self.config.uri, "set tags", self.failures):
            self.client.log_batch(self.run_id, tags=batch)

    def log_artifacts(self, path: Path, artifact_path: Optional[str] = None) -> None:
        if path.is_dir():
            with guarded(self.config.uri, "log artifacts", self.failures):
                self.client.log_artifacts(self.run_id, str(path), artifact_path)
        elif path.is_file():
            with guarded(self.config.uri, "log an artifact", self.failures):
                self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_description(self, markdown: str) -> None:
        """The run's description in MLflow's UI."""
        self.set_tags({NOTE_TAG: markdown})

    def end(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        if self.system_metrics is not None:
            with guarded(self.config.uri, "log system metrics", self.failures):
                self._finish_system_metrics()
        with guarded(self.config.uri, "end the run", self.failures):
            self.client.set_terminated(self.run_id, status)

    @classmethod
    def of_run(cls, config, run_id: str) -> "MlflowTracker":
        """A tracker of an existing run (another process started it): add to it, end it."""
        tracker = cls(config)
        tracker.client, tracker.run_id = client_for(config.uri), run_id
        return tracker


class NoTracker:
    run_id: Optional[str] = None
    failures: Sequence[str] = ()

    def last_logged_step(self, key: str) -> int:
        return 0

    def check(self) -> None:
        pass

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

    @classmethod
    def of_run(cls, config, run_id: str) -> "NoTracker":
        return cls()


# Keyed by the options of conf/tracking/ (bwopt.schema.SCHEMAS["tracking"]).
TRACKERS = {"mlflow": MlflowTracker, "none": lambda config: NoTracker()}


def build_tracker(config):
    return TRACKERS[config.name](config)


def tracker_of_run(config, run_id: Optional[str]):
    """The tracker of a run another process started (a cluster's chief): NoTracker without one."""
    if config.name != "mlflow" or not run_id:
        return NoTracker()
    return MlflowTracker.of_run(config, run_id)


def reap_runs(tracking) -> list:
    """Mark KILLED the RUNNING runs of `tracking.experiment` whose process on this host is gone (a
    sweep job killed by a signal); the ids marked (none without MLflow, or if the store fails)."""
    if tracking.name != "mlflow":
        return []
    with guarded(tracking.uri, "mark the runs of killed processes KILLED"):
        client, experiment_id = open_client(tracking)
        return reap_dead_runs(client, [experiment_id])
    return []


def end_runs_of_process(tracking, pid: int, status: str, reason: str) -> list:
    """End, with `status` and `reason`, the RUNNING runs of process `pid` of this host (a cluster's
    chief that died, or was killed, before it ended its run); the ids ended."""
    import socket

    if tracking.name != "mlflow":
        return []
    with guarded(tracking.uri, "end the run of a process that ended without ending it"):
        client, experiment_id = open_client(tracking)
        query = (
            f"attributes.status = 'RUNNING' and tags.`bwopt.host` = '{socket.gethostname()}' "
            f"and tags.`bwopt.pid` = '{pid}'"
        )
        ended = []
        for run in client.search_runs([experiment_id], query, max_results=100):
            client.set_tag(run.info.run_id, "bwopt.end_reason", reason)
            client.set_terminated(run.info.run_id, status)
            ended.append(run.info.run_id)
        return ended
    return []


def complete(run_folder: Path) -> str:
    """Log a run folder's summary.json to its MLflow run (after a tracking outage) and end it with
    the status the run had; returns the run id. The store is the run's own `tracking.uri`."""
    from omegaconf import OmegaConf

    summary = json.loads((run_folder / "summary.json").read_text())
    config_file = run_folder / ".hydra" / "config.yaml"
    config = OmegaConf.load(config_file if config_file.exists() else run_folder / "config.yaml")
    figures = {  # the numbers the run measured (unmeasured ones are null)
        key: value for key, value in (summary["figures"] or {}).items() if isinstance(value, (int, float))
    }
    tracker = MlflowTracker.of_run(config.tracking, summary["run_id"])
    tracker.log_metrics(readable_metrics({**figures, **summary["measurements"]}))
    if summary["final_metrics"]:  # the last epoch's, at its number as printed
        tracker.log_metrics(summary["final_metrics"], step=int(config.train.epochs))
    tracker.log_artifacts(run_folder / "summary.json")
    tracker.log_artifacts(run_folder / "plots", "plots")
    tracker.client.set_terminated(summary["run_id"], summary["status"])
    return summary["run_id"]
