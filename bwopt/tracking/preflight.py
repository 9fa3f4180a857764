"""The MLflow store checked before a run starts: every wait bounded, every failure one line.

A store that cannot be used stops the run within seconds with one line naming `tracking.uri` and
the cause (`TrackingUnavailable`): a server that does not answer or refuses the credentials, a
sqlite file that is not a database, one locked by another process for `SQLITE_BUSY_WAIT_S`, one made
by another MLflow version, a folder that cannot be written or has no room for a new store. While
the run starts, an HTTP call gives up after `START_TIMEOUT_S` (no retry); during the run after
`HTTP_TIMEOUT_S` x (1 + `HTTP_MAX_RETRIES`) seconds at most. Nothing here imports MLflow or
TensorFlow: a run checks its store before importing either.
"""

import contextlib
import os
import urllib.parse
from pathlib import Path
from typing import Optional

from bwopt.disk import free_bytes, missing_folders, readable_bytes, remove_folders
from bwopt.redact import redact_text

# Bounded waits on an HTTP tracking server (MLflow's defaults retry for minutes); the user's own
# MLFLOW_HTTP_REQUEST_* variables win.
START_TIMEOUT_S = 5
HTTP_TIMEOUT_S = 10
HTTP_MAX_RETRIES = 2
# A new sqlite store: MLflow's tables (~1 MB) and a run's records.
NEW_STORE_BYTES = 2 * 10**6
# How long a sqlite store locked by another process (a writer, a `BEGIN EXCLUSIVE`) is waited for.
SQLITE_BUSY_WAIT_S = 10
HTTP_TIMEOUT_ENV, HTTP_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
# Names of the HTTP bounds bwopt set (the user's own are never changed), passed on to child processes.
BOUNDS_SET_ENV = "BWOPT_MLFLOW_BOUNDS_SET"


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be used: nothing was measured yet, so the run does not start."""


def sqlite_path(uri: str) -> Optional[Path]:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def check_store(uri: str) -> None:
    """Fail fast, naming tracking.uri, when the store cannot work: a sqlite file that cannot be written,
    an HTTP server that does not answer within START_TIMEOUT_S. Sets MLflow's HTTP bounds."""
    database = sqlite_path(uri)
    if database is not None:
        folder = database.parent if database.parent != Path("") else Path(".")
        made = missing_folders(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)  # as the store's lock would, with one line if it cannot
        except OSError as error:
            if not isinstance(error, FileExistsError):
                raise TrackingUnavailable(
                    f"tracking.uri={redact_text(uri)}: the folder {folder} cannot be made ({error.strerror}); "
                    "point tracking.uri at a writable place"
                ) from None
        folder = next((parent for parent in (folder, *folder.parents) if parent.exists()), Path("."))
        target = database if database.exists() else folder
        if database.is_dir() or not folder.is_dir():
            what = (
                f"{database} is a folder, not a database file"
                if database.is_dir()
                else f"{folder} is a file, not a folder"
            )
            raise TrackingUnavailable(
                f"tracking.uri={redact_text(uri)}: {what}; point tracking.uri at a writable place"
            )
        if not os.access(target, os.W_OK):
            raise TrackingUnavailable(
                f"tracking.uri={redact_text(uri)}: {target} is not writable; point tracking.uri at a writable place"
            )
        if database.is_file() and database.stat().st_size:
            probe_sqlite(uri, database)
        elif free_bytes(folder) < NEW_STORE_BYTES:
            remove_folders(made)
            raise TrackingUnavailable(
                f"tracking.uri={redact_text(uri)}: no space left: {readable_bytes(free_bytes(folder))} free on "
                f"{folder}, and a new MLflow store needs ~{readable_bytes(NEW_STORE_BYTES)}; free some space "
                "or point tracking.uri elsewhere"
            )
        return
    if uri.startswith(("http://", "https://")):
        set_http_bounds()
        probe_server(uri)


def set_http_bounds() -> None:
    """MLflow's HTTP timeout and retries for the run, unless the user set MLflow's own variables."""
    ours = set(filter(None, os.environ.get(BOUNDS_SET_ENV, "").split(",")))
    for name, value in ((HTTP_TIMEOUT_ENV, HTTP_TIMEOUT_S), (HTTP_RETRIES_ENV, HTTP_MAX_RETRIES)):
        if name not in os.environ:
            os.environ[name] = str(value)
            ours.add(name)
    os.environ[BOUNDS_SET_ENV] = ",".join(sorted(ours))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


def start_timeout_s() -> float:
    """START_TIMEOUT_S, or the user's own MLFLOW_HTTP_REQUEST_TIMEOUT where they set one."""
    ours = os.environ.get(BOUNDS_SET_ENV, "").split(",")
    users = os.environ.get(HTTP_TIMEOUT_ENV) if HTTP_TIMEOUT_ENV not in ours else None
    return float(users) if users else START_TIMEOUT_S


def probe_sqlite(uri: str, database: Path) -> None:
    """An existing sqlite store is a database, not locked by another process for more than
    SQLITE_BUSY_WAIT_S, and of a schema this MLflow knows (read with sqlite3, nothing written).

    Raises:
        TrackingUnavailable: naming tracking.uri and the cause.
    """
    import sqlite3

    shown = f"tracking.uri={redact_text(uri)}"
    try:
        with contextlib.closing(sqlite3.connect(database, timeout=SQLITE_BUSY_WAIT_S)) as connection:
            # A shared lock, as a reader takes: waits while a writer or `BEGIN EXCLUSIVE` holds the file.
            tables = {row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")}
            revision = None
            if "alembic_version" in tables:
                revision = connection.execute("select version_num from alembic_version").fetchone()
    except sqlite3.OperationalError as error:
        if "locked" in str(error):
            raise TrackingUnavailable(
                f"{shown}: {database} is locked by another process (waited {SQLITE_BUSY_WAIT_S} s); "
                "try again once it is done, or use another tracking.uri"
            ) from None
        raise TrackingUnavailable(f"{shown}: {database} cannot be read ({error})") from None
    except sqlite3.DatabaseError as error:
        raise TrackingUnavailable(
            f"{shown}: {database} is not an SQLite database ({error}); point tracking.uri at an MLflow store "
            "or at a new file"
        ) from None
    if tables and "alembic_version" not in tables:
        raise TrackingUnavailable(f"{shown}: {database} is an SQLite database but not an MLflow store")
    if revision and revision[0] not in known_schema_revisions():
        raise TrackingUnavailable(
            f"{shown}: {database} was made by another MLflow version (schema revision {revision[0]}, unknown "
            "to the MLflow installed here); use that MLflow version, or another tracking.uri"
        )


def known_schema_revisions() -> set:
    """The database schema revisions of the MLflow installed here (its alembic migrations; read, not imported)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("mlflow")
    folders = [Path(location) / "store" / "db_migrations" / "versions" for location in spec.submodule_search_locations]
    pattern = re.compile(r'^revision\s*=\s*["\']([0-9a-zA-Z_]+)["\']', re.MULTILINE)
    return {match for folder in folders for path in folder.glob("*.py") for match in pattern.findall(path.read_text())}


@contextlib.contextmanager
def start_bounds(uri: str):
    """While a run starts on an HTTP store (nothing measured yet): each call gives up after
    START_TIMEOUT_S, without retries, unless the user set MLflow's own variables."""
    if not uri.startswith(("http://", "https://")):
        yield
        return
    set_http_bounds()
    ours = os.environ[BOUNDS_SET_ENV].split(",")
    before = {name: os.environ[name] for name in ours if name}
    os.environ.update(
        {
            name: value
            for name, value in ((HTTP_TIMEOUT_ENV, str(START_TIMEOUT_S)), (HTTP_RETRIES_ENV, "0"))
            if name in before
        }
    )
    try:
        yield
    finally:
        os.environ.update(before)


def server_uri(uri: str) -> str:
    """`uri` without its user-info; a `user:password@` in it becomes MLflow's credential variables
    (MLFLOW_TRACKING_USERNAME / _PASSWORD), unless they are set already."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri
    if parts.username is not None:
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", urllib.parse.unquote(parts.username))
    if parts.password is not None:
        os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", urllib.parse.unquote(parts.password))
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def probe_server(uri: str) -> None:
    """The server answers `/health` and its API takes the credentials, within `start_timeout_s()` each.

    Raises:
        TrackingUnavailable: no answer, refused credentials (401, 403) or a server error, naming tracking.uri.
    """
    import base64
    import urllib.error
    import urllib.request

    base = server_uri(uri).rstrip("/")
    headers = {}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    shown = f"tracking.uri={redact_text(uri)}"
    # /health answers without credentials; the API does not (404: no such experiment, and that is fine).
    for path in ("/health", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"):
        try:
            urllib.request.urlopen(
                urllib.request.Request(base + path, headers=headers), timeout=start_timeout_s()
            ).close()
        except urllib.error.HTTPError as error:
            if error.code == 404 and "experiments" in path:
                continue
            if error.code in (401, 403):
                raise TrackingUnavailable(
                    f"{shown}: the server refused the credentials ({error.code}); "
                    "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or user:password@ in tracking.uri)"
                ) from None
            raise TrackingUnavailable(
                f"{shown}: the server answered {path.split('?')[0]} with {error.code} {error.reason}; "
                "check the server's log, or use tracking.uri=sqlite:///outputs/mlflow.db or tracking=none"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise TrackingUnavailable(
                f"{shown}: the tracking server did not answer within {start_timeout_s():g} s "
                f"({redact_text(str(error))}); "
                "start it, or use tracking.uri=sqlite:///outputs/mlflow.db or tracking=none"
            ) from None
