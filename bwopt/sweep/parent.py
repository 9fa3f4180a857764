"""The MLflow parent run of a sweep: one per `python -m bwopt -m ...` with tracking=mlflow.

Its id reaches every job as BWOPT_PARENT_RUN_ID (bwopt's tracking tags the job's run as its
child). At the end it holds the report files as artifacts and the report's table as its
description. Like a job's tracker, it never ends a sweep: a store that fails warns on stderr.
"""

import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

from hydra.core.utils import filter_overrides

NOTE_TAG = "mlflow.note.content"  # what the MLflow UI shows as a run's description


def sweep_name(job_overrides: Sequence[Sequence[str]]) -> str:
    """'sweep pipeline.prefetch=0,2': the keys whose value changes across the jobs, with their values."""
    values = {}
    for overrides in job_overrides:
        for override in filter_overrides(overrides):
            key, _, value = override.partition("=")
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    swept = [f"{key}={','.join(choices)}" for key, choices in values.items() if len(choices) > 1]
    return "sweep " + (" ".join(swept) or " ".join(filter_overrides(job_overrides[0])) or "(defaults)")


class ParentRun:
    def __init__(self, client, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    @classmethod
    def start(cls, tracking, name: str, sweep_dir: Path) -> Optional["ParentRun"]:
        """The parent run, in `tracking.experiment` of `tracking.uri`; None (with a warning) if the store fails."""
        from mlflow import MlflowClient

        from bwopt.tracking import sqlite_artifact_location

        try:
            client = MlflowClient(tracking_uri=tracking.uri)
            experiment = client.get_experiment_by_name(tracking.experiment)
            if experiment is None:
                experiment_id = client.create_experiment(
                    tracking.experiment, artifact_location=sqlite_artifact_location(tracking.uri)
                )
            else:
                experiment_id = experiment.experiment_id
            tags = {
                **{key: str(value) for key, value in tracking.tags.items()},
                "bwopt.sweep_dir": str(sweep_dir.resolve()),
            }
            run = client.create_run(experiment_id, run_name=name, tags=tags)
        except Exception as error:
            print(f"bwopt: warning: MLflow could not create the sweep's parent run: {error}", file=sys.stderr)
            return None
        return cls(client, run.info.run_id)

    def resume(self) -> None:
        """A later batch of the same sweep (a sweeper that launches in batches)."""
        self._guarded("resume the parent run", lambda: self.client.update_run(self.run_id, status="RUNNING"))

    def annotate(self, files: Sequence[Path], tags: Dict[str, str]) -> None:
        """Log more files and tags onto the run (a search's results, after its last batch)."""
        for path in files:
            self._guarded(f"log {path.name}", lambda path=path: self.client.log_artifact(self.run_id, str(path)))
        for key, value in tags.items():
            self._guarded(f"set tag {key}", lambda key=key, value=value: self.client.set_tag(self.run_id, key, value))

    def end(self, status: str, report) -> None:
        """Log the report (bwopt.sweep.report.Report, or None) and end the run with `status`."""
        if report is not None:
            for path in report.files:
                self._guarded(f"log {path.name}", lambda path=path: self.client.log_artifact(self.run_id, str(path)))
            self._guarded("set the description", lambda: self.client.set_tag(self.run_id, NOTE_TAG, report.summary))
        self._guarded("end the parent run", lambda: self.client.set_terminated(self.run_id, status))

    def _guarded(self, what: str, action) -> None:
        try:
            action()
        except Exception as error:  # a tracking outage must not end the sweep
            print(f"bwopt: warning: MLflow could not {what}: {error}", file=sys.stderr)
