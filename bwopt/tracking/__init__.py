"""Experiment tracking: the only part of bwopt that talks to MLflow.

    store.py   the store: checked before a run, locked while created, opened; `guarded`, the one
               "warn and go on" for a store that fails while something is being measured
    names.py   run names, tags, params and metric units (no MLflow)
    runs.py    one run's tracker (MLflow or none), completing or ending a run from another process
    sweeps.py  a sweep's parent run; reading a sweep back from MLflow
    cli.py     `python -m bwopt.tracking complete RUN_FOLDER | reap URI [EXPERIMENT]`

A tracker that fails while logging during a measurement warns on stderr and goes on: the
measurement is still printed and written to the run folder, and `python -m bwopt.tracking
complete RUN_FOLDER` completes the MLflow run from it later. MLflow itself is imported only inside
the functions that use it.
"""

from bwopt.tracking.cli import main
from bwopt.tracking.names import PARENT_RUN_ENV, flatten, readable_metrics, run_name
from bwopt.tracking.preflight import TrackingUnavailable
from bwopt.tracking.runs import TRACKERS, MlflowTracker, NoTracker, build_tracker, complete, tracker_of_run
from bwopt.tracking.store import guarded, sqlite_artifact_location
from bwopt.tracking.sweeps import ParentRun, download_sweep

__all__ = [
    "TRACKERS",
    "PARENT_RUN_ENV",
    "MlflowTracker",
    "NoTracker",
    "ParentRun",
    "TrackingUnavailable",
    "build_tracker",
    "complete",
    "download_sweep",
    "flatten",
    "guarded",
    "main",
    "readable_metrics",
    "run_name",
    "sqlite_artifact_location",
    "tracker_of_run",
]
