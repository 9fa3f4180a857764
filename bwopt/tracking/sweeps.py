"""A sweep in MLflow: its parent run (one per `python -m bwopt -m ...` with tracking=mlflow) and
reading a finished sweep back from its child runs.

The parent's id reaches every job as BWOPT_PARENT_RUN_ID (`names.run_tags` makes the job's run
its child). At the end it holds the report files as artifacts and the report's table as its
description. Like a job's tracker, it never ends a sweep: a store that fails warns on stderr.
"""

import os
import socket
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

from bwopt.tracking.names import NOTE_TAG
from bwopt.tracking.store import client_for, guarded, open_client

# MLflow refuses tag values longer than this; the description is a tag (mlflow.note.content).
MAX_DESCRIPTION_CHARS = 8000


def within_limit(markdown: str, limit: int = MAX_DESCRIPTION_CHARS) -> str:
    """`markdown` cut at a line boundary to fit MLflow's limit, saying where the rest is."""
    if len(markdown) <= limit:
        return markdown
    note = "\n\n… cut to fit MLflow's description limit: the whole report is `report.md` in this run's artifacts."
    kept = markdown[: limit - len(note)].rsplit("\n", 1)[0]
    return kept + note


def unique_name(name: str, taken: Sequence[str]) -> str:
    """`name`, or `name #2`, `#3`... the first that is not in `taken`."""
    number, candidate = 1, name
    while candidate in taken:
        number += 1
        candidate = f"{name} #{number}"
    return candidate


def _recent_names(client, experiment_id: str) -> list:
    """Names of the experiment's runs started in the last minute (where a name stamped to the second could clash)."""
    import time

    since = int((time.time() - 60) * 1000)
    runs = client.search_runs([experiment_id], f"attributes.start_time >= {since}", max_results=1000)
    return [run.info.run_name for run in runs]


class ParentRun:
    def __init__(self, client, uri: str, run_id: str) -> None:
        self.client = client
        self.uri = uri
        self.run_id = run_id

    @classmethod
    def start(cls, tracking, name: str, sweep_dir: Path) -> Optional["ParentRun"]:
        """The parent run, in `tracking.experiment` of `tracking.uri`; None (with a warning) if the store fails.

        Named `name` and the time it starts ('sweep pipeline.prefetch=0,2 · 2026-12-01 11:40:02'), so
        that sweeps of the same overrides differ in the runs table; a second sweep started within the
        same second gets ' #2' (and so on).
        """
        import time

        tags = {
            **{key: str(value) for key, value in tracking.tags.items()},
            "bwopt.sweep_dir": str(sweep_dir.resolve()),
            # a launcher killed outright leaves its run RUNNING: the next start reaps it by these
            "bwopt.host": socket.gethostname(),
            "bwopt.pid": str(os.getpid()),
        }
        with guarded(tracking.uri, "create the sweep's parent run"):
            client, experiment_id = open_client(tracking)
            started_ms = int(time.time() * 1000)
            name = unique_name(f"{name} · {time.strftime('%Y-%m-%d %H:%M:%S')}", _recent_names(client, experiment_id))
            run = client.create_run(experiment_id, start_time=started_ms, run_name=name, tags=tags)
            return cls(client, tracking.uri, run.info.run_id)
        return None

    def lead_description(self, sentence: str) -> None:
        """Put `sentence` first in the run's description (a search's comparison, after its report)."""
        with guarded(self.uri, "lead the description"):
            note = self.client.get_run(self.run_id).data.tags.get(NOTE_TAG, "")
            self.client.set_tag(self.run_id, NOTE_TAG, within_limit(f"**{sentence}**\n\n{note}".strip()))

    def resume(self) -> None:
        """A later batch of the same sweep (a sweeper that launches in batches)."""
        with guarded(self.uri, "resume the parent run"):
            self.client.update_run(self.run_id, status="RUNNING")

    def annotate(self, files: Sequence[Path], tags: Dict[str, str], root: Optional[Path] = None) -> None:
        """Log more files and tags onto the run (a search's results, after its last batch); a file in a
        folder below `root` keeps that folder in the run's artifacts."""
        for path in files:
            below = root is not None and path.parent != root and path.parent.is_relative_to(root)
            folder = str(path.parent.relative_to(root)) if below else None
            with guarded(self.uri, f"log {path.name}"):
                self.client.log_artifact(self.run_id, str(path), folder)
        for key, value in tags.items():
            with guarded(self.uri, f"set tag {key}"):
                self.client.set_tag(self.run_id, key, value)

    def log_figures(self, metrics: Dict[str, float], params: Dict[str, str]) -> None:
        """The sweep's own metrics and params; a param logged by an earlier batch keeps its value."""
        import time

        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        logged = set()
        with guarded(self.uri, "read the parent run's params"):
            logged = set(self.client.get_run(self.run_id).data.params)
        with guarded(self.uri, "log the sweep's figures"):
            self.client.log_batch(
                self.run_id,
                metrics=[Metric(key, float(value), now, 0) for key, value in metrics.items()],
                params=[Param(key, str(value)) for key, value in params.items() if key not in logged],
            )

    def end(self, status: str, report) -> None:
        """Log the report (bwopt.sweep.report.Report, or None) and end the run with `status`."""
        if report is not None:
            self.annotate(report.files, {NOTE_TAG: within_limit(report.summary)})
            self.log_figures(*report.parent_figures())
        with guarded(self.uri, "end the parent run"):
            self.client.set_terminated(self.run_id, status)


def job_run_figures(tracking, parent_run_id: str, pid: int) -> Optional[dict]:
    """The MLflow run of the sweep job that process `pid` ran (a child of `parent_run_id`): its id,
    status, verdict tag and latest metrics (in MLflow's units, `bwopt.tracking.names.readable_metrics`);
    None when the job started no run or the store fails."""
    with guarded(tracking.uri, "read a failed job's MLflow run"):
        client, experiment_id = open_client(tracking)
        children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'")
        for run in children:
            if run.data.tags.get("bwopt.pid") == str(pid):
                tags = run.data.tags
                found = {"run_id": run.info.run_id, "status": run.info.status, "metrics": dict(run.data.metrics)}
                return {**found, "verdict": tags.get("verdict"), "host": tags.get("bwopt.host")}
    return None


def download_sweep(tracking_uri: str, parent_run_id: str, output: Path) -> Path:
    """The children of an MLflow parent run as job folders (summary.json, .hydra/overrides.yaml) under output."""
    client = client_for(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    for number, child in enumerate(children):
        folder = output / str(number)
        (folder / ".hydra").mkdir(parents=True, exist_ok=True)
        for artifact in ("summary.json", ".hydra/overrides.yaml"):
            try:  # MLflow writes the file into the folder given, under its base name
                client.download_artifacts(child.info.run_id, artifact, str((folder / artifact).parent))
            except Exception as error:  # a child that died before logging it is reported as such
                print(f"bwopt: warning: run {child.info.run_id} has no {artifact}: {error}", file=sys.stderr)
    return output
