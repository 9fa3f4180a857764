"""Task functions for the launcher tests: each job does what its `+crash=` override says, without TensorFlow.

Imported by name in the job's own process (the launcher hands the child its sys.path).
"""

import json
import os
import signal
import sys
import time
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
    if cfg.crash == "wait_for_stop":
        (folder / "waiting").touch()
        while not STOP.requested:
            time.sleep(0.05)
        raise KeyboardInterrupt(f"stopped by {STOP.requested}")
    # repeats measure slightly differently: job n gets (1 + n / 10) x the throughput asked for
    return _finished(folder, cfg.throughput * (1 + HydraConfig.get().job.num / 10))


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
