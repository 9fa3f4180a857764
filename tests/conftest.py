"""Shared fixtures: compose the real conf/, shrunk to tiny runs that write under tmp_path."""

import contextlib
import inspect
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bwopt.app import config_dir, validate

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(config, items):
    """A test that checks a time against a known answer must be marked `timing`: `make test` runs those
    alone, after the others ran two at a time, so that no other test's work sits in their window."""
    unmarked = sorted(
        {
            item.nodeid.split("[")[0]
            for item in items
            if item.get_closest_marker("timing") is None
            and any(call in inspect.getsource(item.function) for call in ("known_answer(", "cpu_share("))
        }
    )
    if unmarked:
        raise pytest.UsageError(f"checks a time against a known answer but is not marked timing: {unmarked}")


def small_sample_images(directory, num_images: int) -> list:
    """Overrides for data=sample_images in `directory`: `num_images` JPEGs of 40-64 px, decoded to
    16x16 with imagenet's random crops and flips, split uniformly."""
    return [
        "data=sample_images",
        f"data.directory={directory}",
        f"data.num_images={num_images}",
        "data.saved_side_px=[40,64]",
        "data.image_size=[16,16]",
        "split=uniform",
        "pipeline.preprocess=imagenet",
        "pipeline.vectorized_map=false",
    ]


# Tests count the epochs' steps: no extra timed steps unless a test asks for a window.
TEST_DEFAULTS = ["measure.min_timed_s=0"]


def compose_config(overrides=()):
    """The real conf/ composed with Hydra's compose API, plus `TEST_DEFAULTS` and overrides."""
    overrides = list(overrides)
    defaults = [item for item in TEST_DEFAULTS if item.split("=")[0] not in {o.split("=")[0] for o in overrides}]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=[*defaults, *overrides])


@pytest.fixture(scope="session", autouse=True)
def devices():
    """The default device set-up (2 logical CPUs), once: TensorFlow fixes its devices per process."""
    from bwopt.devices import configure

    return configure(validate(compose_config()).device)


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory):
    """One sqlite store for the session: creating its tables costs seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def run_experiment(tmp_path, mlflow_uri, request):
    """Compose, validate and run an experiment in this process; returns its Summary."""
    from bwopt.modes import run

    def _run(*overrides, experiment=None):
        experiment = experiment or request.node.name
        tracking = [f"tracking.uri={mlflow_uri}", f"tracking.experiment='{experiment}'"]
        cfg = compose_config([*([] if "tracking=none" in overrides else tracking), *overrides])
        resolved = OmegaConf.to_container(cfg, resolve=True)
        return run(validate(cfg), output_dir=tmp_path / "run", resolved=resolved)

    return _run


@pytest.fixture
def mlflow_client(mlflow_uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=mlflow_uri)


@pytest.fixture
def installed():
    """bwopt's handlers on SIGINT, SIGTERM and SIGHUP for one test, pytest's put back after. SIGHUP
    starts at its default, as in a terminal: under `nohup` it is ignored, and stays so."""
    from bwopt.signals import STOP, STOP_SIGNALS

    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    STOP.reset()
    STOP.install()
    yield STOP
    STOP.reset()
    STOP.installed = False
    for signum, handler in before.items():
        signal.signal(signum, handler)


# Hydra's flags that take a value (the value follows as the next argument); --info's is optional
VALUED_FLAGS = {"-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name", "-c", "--cfg", "-p", "--package"}
VALUED_FLAGS |= {"--experimental-rerun", "-i", "--info"}


def run_bwopt(*args, cwd, timeout=300, env=None):
    """`python -m bwopt ARGS` in a fresh process; a single run gets `TEST_DEFAULTS` unless ARGS set
    those keys (a multirun does not: its jobs are named after their overrides). They go after the
    flags ARGS starts with: Hydra's command line takes its overrides in one run."""
    given = {argument.split("=")[0] for argument in args}
    multirun = "-m" in args or "--multirun" in args
    defaults = [] if multirun else [item for item in TEST_DEFAULTS if item.split("=")[0] not in given]
    flags, rest = [], list(args)
    while rest and rest[0].startswith("-"):
        flags.append(rest.pop(0))
        if flags[-1] in VALUED_FLAGS and rest and "=" not in rest[0] and not rest[0].startswith("-"):
            flags.append(rest.pop(0))
    return subprocess.run(
        [sys.executable, "-m", "bwopt", *flags, *defaults, *rest],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def count_runs(database: Path) -> int:
    """Runs in a sqlite MLflow store, read with sqlite3 itself."""
    if not database.exists():
        return 0
    with sqlite3.connect(database) as connection:
        return connection.execute("select count(*) from runs").fetchone()[0]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(folder: Path, port: Optional[int] = None, start_timeout_s: float = 90.0, app_name: str = ""):
    """A real `mlflow server` on 127.0.0.1 with a sqlite store in `folder`; yields its URI, stops it after.

    `app_name="basic-auth"`: MLflow's own basic authentication (user admin, password bwopt-test-pass-7731).
    """
    import signal
    import time
    import urllib.request

    port = port or free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'db'}", "--default-artifact-root", str(folder / "art")]
    environment = dict(os.environ)
    if app_name:
        command += ["--app-name", app_name]
        auth = folder / "basic_auth.ini"  # the server's own user store, beside its database
        auth.write_text(
            f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{folder / 'auth.db'}\n"
            "admin_username = admin\nadmin_password = bwopt-test-pass-7731\nauthorization_function = "
            "mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        environment["MLFLOW_AUTH_CONFIG_PATH"] = str(auth)
        environment["MLFLOW_FLASK_SERVER_SECRET_KEY"] = "bwopt-tests"  # the auth app's CSRF key
    log_file = folder / f"server-{port}.log"
    with log_file.open("a") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder, env=environment
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited with {server.returncode}: {log_file.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"mlflow server not up after {start_timeout_s} s: {log_file.read_text()[-3000:]}")
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers: the session started for it
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def cpu_share(window_s: float = 0.3) -> float:
    """The share of a core this process gets now: CPU time over wall time while it spins for `window_s`."""
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < window_s:
        pass
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def experiment_presets():
    """The names of conf/experiment/'s presets, sorted."""
    return sorted(path.stem for path in (Path(config_dir()) / "experiment").glob("*.yaml"))


def as_a_terminals_job() -> None:
    """`preexec_fn` of a child that stands for a job started from a terminal: SIGHUP at its default.
    An ignored signal stays ignored across exec, so under `nohup` (or any runner that ignores
    SIGHUP) the child would inherit that, and bwopt rightly keeps an ignored SIGHUP ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def others_busy_cores(window_s: float = 0.5) -> float:
    """The cores kept busy by anything but this process over the next `window_s` while it sleeps:
    other processes, the kernel's work for them and the time the hypervisor gave another machine
    (steal), from /proc/stat's busy time less this process's own CPU time."""

    def busy_s() -> float:
        user, nice, system, _, _, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    def own_s() -> float:
        times = os.times()
        return times.user + times.system

    wall, busy, own = time.perf_counter(), busy_s(), own_s()
    time.sleep(window_s)
    return max(0.0, (busy_s() - busy) - (own_s() - own)) / (time.perf_counter() - wall)


def known_answer(met: bool, message: str, least_share: float = 0.85, most_others: float = 0.25) -> None:
    """Assert a known workload's answer. Where it is not met and the machine is busy with other
    work (this process gets less than `least_share` of a core now, other work keeps more than
    `most_others` of a core busy, or the last minute's load average exceeds the cores by more than
    one: a thread then waits for a core), skip and say so: the machine could not give the answer,
    which a quiet machine (CI) checks."""
    if met:
        return
    share, others = cpu_share(), others_busy_cores()
    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    state = (
        f"this process gets {share:.0%} of a core, other work keeps {others:.2f} cores busy, load average "
        f"{load:.1f} on {cores} cores"
    )
    if share < least_share or others > most_others or load > cores + 1:
        pytest.skip(f"machine too loaded to calibrate: {state} ({message})")
    raise AssertionError(f"{message} ({state})")
