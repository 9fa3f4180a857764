"""Task functions for the launcher tests: each job does what its `+crash=` override says, without TensorFlow.

Imported by name in the job's own process (the launcher hands the child its sys.path).
"""

import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from bwopt.signals import STOP


def _finished(folder: Path, throughput: float) -> float:
    figures = {"throughput_examples_per_s": throughput, "input_wait_fraction": 0.25, "input_bound_verdict": "highly"}
    summary = {"status": "FINISHED", "run_id": None, "figures": figures, "measurements": {}, "final_metrics": {}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return throughput


def crash(cfg) -> float:
    folder = Path(HydraConfig.get().runtime.output_dir)
    job = {"pid": os.getpid(), **{name: os.environ.get(name) for name in ("BWOPT_SWEEP_DIR", "BWOPT_PARENT_RUN_ID")}}
    (folder / "process.json").write_text(json.dumps(job))
    if cfg.crash == "exception":
        raise ValueError("a bad value for this job")
    if cfg.crash == "exit2":
        sys.exit(2)
    if cfg.crash == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if cfg.crash == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.crash == "kill9_after_metrics":
        _record_in_mlflow(cfg)
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.crash == "wait_for_stop":
        (folder / "waiting").touch()
        while not STOP.requested:
            time.sleep(0.05)
        raise KeyboardInterrupt(f"stopped by {STOP.requested}")
    # repeats measure slightly differently: job n gets (1 + n / 10) x the throughput asked for
    return _finished(folder, cfg.throughput * (1 + HydraConfig.get().job.num / 10))


def _record_in_mlflow(cfg) -> None:
    """What a bwopt job records in its MLflow run before it writes summary.json: named and tagged as
    bwopt names a job's run (bwopt.tracking.names), its figures in MLflow's units, in the store of
    TEST_MLFLOW_URI."""
    from mlflow import MlflowClient

    from bwopt.tracking.names import run_name, run_tags

    overrides = list(HydraConfig.get().overrides.task)
    # the parent's store (the launcher tests compose the jobs' configs without the command line's overrides)
    client = MlflowClient(tracking_uri=os.environ["TEST_MLFLOW_URI"])
    experiment = client.get_run(os.environ["BWOPT_PARENT_RUN_ID"]).info.experiment_id
    run = client.create_run(experiment, run_name=run_name(overrides), tags=run_tags(overrides))
    for key, value in {"throughput_examples_per_s": 123.0, "input_wait_pct": 25.0, "step_time_p50_ms": 2.0}.items():
        client.log_metric(run.info.run_id, key, value)
    client.set_tag(run.info.run_id, "verdict", "highly input-bound")


def scored(cfg) -> float:
    """A search trial without TensorFlow: measures `+throughput` and `+accuracy` as asked.

    A throughput of 0 measures nothing (NaN, as bwopt.app.run_job returns then); below 0 the job raises.
    """
    folder = Path(HydraConfig.get().runtime.output_dir)
    if cfg.throughput < 0:
        raise ValueError("a broken trial")
    if cfg.throughput == 0:
        summary = {"status": "FINISHED", "run_id": None, "figures": None, "measurements": {}, "final_metrics": {}}
        (folder / "summary.json").write_text(json.dumps(summary))
        return float("nan")
    _finished(folder, cfg.throughput)
    summary = json.loads((folder / "summary.json").read_text())
    summary["final_metrics"] = {"val_accuracy": cfg.accuracy}
    (folder / "summary.json").write_text(json.dumps(summary))
    return float(cfg.throughput)


PREFETCH_THROUGHPUT = {0: 100.0, 2: 200.0, "autotune": 150.0}


def scored_by_prefetch(cfg) -> float:
    """A search trial without TensorFlow whose throughput depends on `pipeline.prefetch` (a key the
    config has, so the search starts from its configured value), with a ±2 % interval."""
    folder = Path(HydraConfig.get().runtime.output_dir)
    throughput = PREFETCH_THROUGHPUT[cfg.pipeline.prefetch]
    _finished(folder, throughput)
    summary = json.loads((folder / "summary.json").read_text())
    summary["figures"]["throughput_examples_per_s_ci95"] = [throughput * 0.98, throughput * 1.02]
    (folder / "summary.json").write_text(json.dumps(summary))
    return throughput


def scored_by_prefetch_each_repeat_its_own(cfg) -> float:
    """`scored_by_prefetch`, each job measuring (1 + its number / 100) times as much: repeats differ."""
    folder = Path(HydraConfig.get().runtime.output_dir)
    throughput = PREFETCH_THROUGHPUT[cfg.pipeline.prefetch] * (1 + HydraConfig.get().job.num / 100)
    _finished(folder, throughput)
    summary = json.loads((folder / "summary.json").read_text())
    summary["figures"]["throughput_examples_per_s_ci95"] = [throughput * 0.98, throughput * 1.02]
    (folder / "summary.json").write_text(json.dumps(summary))
    return throughput


@contextmanager
def sigterm_once_waiting(waiting: Path):
    """SIGTERM to this process once a `+crash=wait_for_stop` job has touched `waiting` (or after 60
    s), handled by STOP in the main thread as in `python -m bwopt`; the signal handlers and STOP as
    they were afterwards. For launchers that run in this process and their jobs' stop."""

    def terminate_once_waiting():
        deadline = time.monotonic() + 60
        while not waiting.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    STOP.install()
    threading.Thread(target=terminate_once_waiting, daemon=True).start()
    try:
        yield
    finally:
        STOP.reset()
        STOP.installed = False
        for number, handler in handlers.items():
            signal.signal(number, handler)
