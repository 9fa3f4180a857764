"""Experiment tracking: an MLflow run per experiment, or nothing.

A tracker that fails while logging during a measurement warns on stderr and goes on: the
measurement is still printed and written to the run folder.
"""

import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

MLFLOW_PARAMS_PER_BATCH = 100
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


class MlflowTracker:
    def __init__(self, config) -> None:
        self.config = config
        self.client = None
        self.run_id: Optional[str] = None

    def start(self, params: Dict[str, str], tags: Dict[str, str], overrides: Sequence[str] = ()) -> str:
        """Create the run, named from `overrides` unless tracking.run_name is set, with MLflow's
        own source tags (source name and type, user, git commit), as its fluent API sets them."""
        from mlflow import MlflowClient
        from mlflow.entities import Param
        from mlflow.tracking.context.registry import resolve_tags

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
        tags = resolve_tags({**run_tags(overrides), **self.config.tags, **tags})
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
        return self.run_id

    def _guarded(self, what: str, action) -> None:
        try:
            action()
        except Exception as error:  # a tracking outage must not end the measurement
            print(f"bwopt: warning: MLflow could not {what}: {error}", file=sys.stderr)

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

    def end(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        self._guarded("end the run", lambda: self.client.set_terminated(self.run_id, status))


class NoTracker:
    run_id: Optional[str] = None

    def start(self, params: Dict[str, str], tags: Dict[str, str], overrides: Sequence[str] = ()) -> Optional[str]:
        return None

    def log_metrics(self, metrics: Dict[str, float], step: int = 0) -> None:
        pass

    def set_tags(self, tags: Dict[str, str]) -> None:
        pass

    def log_artifacts(self, path: Path, artifact_path: Optional[str] = None) -> None:
        pass

    def end(self, status: str) -> None:
        pass


# Keyed by the options of conf/tracking/ (bwopt.schema.SCHEMAS["tracking"]).
TRACKERS = {"mlflow": MlflowTracker, "none": lambda config: NoTracker()}


def build_tracker(config):
    return TRACKERS[config.name](config)
