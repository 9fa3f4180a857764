"""The MLflow store once it has passed its checks (bwopt.tracking.preflight): locked while it is
created, opened, guarded.

Every wait on the store is bounded: its creation's lock for `STORE_LOCK_TIMEOUT_S`, MLflow's own
errors while a run starts become one `TrackingUnavailable` line. Once a run is measuring, a store
that fails warns on stderr and the work goes on (`guarded`), and the tracker remembers what it
missed.
"""

import contextlib
import fcntl
import socket
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Optional, Sequence

from bwopt.redact import redact_text
from bwopt.tracking.preflight import TrackingUnavailable, check_store, server_uri, sqlite_path

STORE_LOCK_TIMEOUT_S = 120

EXPERIMENT_DESCRIPTION = (
    "bwopt runs: each is one data-parallel TensorFlow training (or input / inference) measurement. "
    "Its name is its command-line overrides; its description holds the summary, the verdict and the "
    "recommendation; a sweep is a parent run with one child run per job."
)


@contextlib.contextmanager
def guarded(uri: str, what: str, failures: Optional[list] = None):
    """Warn on stderr and go on when the store at `uri` fails: a tracking outage never ends a measurement.

    `what` failed is appended to `failures` (the tracker's record of what the MLflow run missed).
    A signal meets the call as `signal_safe` says.
    """
    try:
        with signal_safe(uri):
            yield
    except Exception as error:
        print(f"bwopt: warning: MLflow could not {what}: {first_line(error)}", file=sys.stderr)
        if failures is not None:
            failures.append(what)


def signal_safe(uri: str):
    """How a stop signal meets a call to the store at `uri`.

    A server may hang, so the first signal ends the wait at once (`STOP.interruptible`). A local
    store's call is short and bounded, and a KeyboardInterrupt inside SQLAlchemy's sqlite session
    leaves the file's write lock held for the rest of the process, so that every later write (the
    run's KILLED status among them) waits out the busy timeout and fails: there the signal is
    acted on once the call is done (`STOP.shielded`).
    """
    from bwopt.signals import STOP

    local = urllib.parse.urlsplit(uri).scheme in ("", "file", "sqlite")
    return STOP.shielded() if local else STOP.interruptible()


def first_line(error: BaseException) -> str:
    """An error's first line, secrets masked (MLflow's and SQLAlchemy's errors run to many lines)."""
    text = str(error).strip()
    return redact_text(text.splitlines()[0] if text else type(error).__name__)


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


# What an experiment bwopt writes to carries, whoever created it: its description, and the kind
# that opens MLflow's "Model training" view rather than the GenAI one.
EXPERIMENT_TAGS = {"mlflow.note.content": EXPERIMENT_DESCRIPTION, "mlflow.experimentKind": "custom_model_development"}


def open_client(tracking) -> tuple:
    """(MlflowClient, experiment id) of `tracking.experiment` in `tracking.uri`, the experiment
    created if it is new (for sqlite, artifacts beside the database), and given `EXPERIMENT_TAGS`
    it lacks.

    Raises:
        TrackingUnavailable: the store cannot be used (checked first, or MLflow's own error), in one line.
    """
    from mlflow import MlflowClient

    check_store(tracking.uri)
    with store_lock(tracking.uri), unavailable_on_error(tracking.uri):  # the client migrates a new store
        client = MlflowClient(tracking_uri=server_uri(tracking.uri))
        experiment = client.get_experiment_by_name(tracking.experiment)
        if experiment is None:
            experiment_id = client.create_experiment(
                tracking.experiment, artifact_location=sqlite_artifact_location(tracking.uri), tags=EXPERIMENT_TAGS
            )
            return client, experiment_id
    for key, value in EXPERIMENT_TAGS.items():
        if key not in experiment.tags:
            with guarded(tracking.uri, f"set the experiment's {key}"):
                client.set_experiment_tag(experiment.experiment_id, key, value)
    return client, experiment.experiment_id


@contextlib.contextmanager
def unavailable_on_error(uri: str):
    """MLflow's (and SQLAlchemy's, requests') errors while a run starts become one TrackingUnavailable line."""
    try:
        yield
    except TrackingUnavailable:
        raise
    except Exception as error:
        raise TrackingUnavailable(
            f"tracking.uri={redact_text(uri)}: the store failed as the run started: {first_line(error)}; "
            "check the store, or use tracking=none"
        ) from None


def client_for(uri: str):
    """An MlflowClient of an existing store (reading back, completing, ending a run)."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server_uri(uri))
