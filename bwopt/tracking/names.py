"""What a run is called and how its figures read in MLflow: names, tags, params, units (no MLflow here)."""

import json
import os
import socket
from typing import Dict, Sequence

# The sweep launcher (bwopt.sweep) passes its parent run to each job's process.
PARENT_RUN_ENV = "BWOPT_PARENT_RUN_ID"
# ... and the override keys the sweep varies (a JSON list), which its jobs' runs are named by.
SWEPT_KEYS_ENV = "BWOPT_SWEPT_KEYS"
NOTE_TAG = "mlflow.note.content"  # what the MLflow UI shows as a run's description


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


def shown_overrides(overrides: Sequence[str]) -> list:
    """The overrides that say what a run measured: Hydra's own and tracking's are left out."""
    return [item for item in overrides if not item.lstrip("+~").startswith(("hydra.", "hydra/", "tracking"))]


def run_name(overrides: Sequence[str]) -> str:
    """'pipeline.prefetch=10,strategy=mirrored' from the overrides, 'default' when there are none.

    In a sweep (SWEPT_KEYS_ENV set by its launcher), only the overrides of the keys the sweep
    varies: the rest is the same in every job (tag `bwopt.overrides` keeps them all).
    """
    shown = shown_overrides(overrides)
    swept = json.loads(os.environ.get(SWEPT_KEYS_ENV) or "[]")
    varied = [item for item in shown if item.partition("=")[0] in swept or item.lstrip("+~").partition("=")[0] in swept]
    return ",".join(varied or shown) or "default"


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


# MLflow's UI shows two decimals: figures go there in units that read well, named in the key.
# summary.json keeps seconds, bytes and fractions. Rules by key suffix, the first match wins.
MIB = 2**20
READABLE_UNITS = (
    ("_bytes_per_s", "_mib_per_s", 1 / MIB),
    ("_examples_per_s", "_examples_per_s", 1.0),
    ("_bytes", "_mib", 1 / MIB),
    ("_fraction", "_pct", 100.0),
)
# ..._s of these are per-step (or per-call) times: milliseconds
MILLISECOND_FIGURES = ("step_time_", "_latency_", "_overhead_s", "ready_execution_s")
INTERVAL_SUFFIXES = ("_ci95_low", "_ci95_high")


def readable_metrics(figures: Dict[str, float]) -> Dict[str, float]:
    """Figures as MLflow metrics: step and per-call times in ms, bytes in MiB, fractions in % (see
    README); an interval's `_ci95_low` / `_ci95_high` in the unit of its figure."""
    metrics = {}
    for key, value in figures.items():
        suffix = next((end for end in INTERVAL_SUFFIXES if key.endswith(end)), "")
        name, scale = readable_name(key[: len(key) - len(suffix)])
        metrics[name + suffix] = float(value) * scale
    return metrics


def readable_name(key: str) -> tuple:
    """(the metric's name, the factor from the figure's unit to the name's)."""
    if key in ("efficiency", "cores_efficiency", "efficiency_spread"):  # the spread in efficiency's unit
        return f"{key}_pct", 100.0
    if key.endswith("cpu_s_per_example"):
        return key.replace("cpu_s_", "cpu_ms_"), 1e3
    if key.endswith("_s") and not key.endswith("_per_s") and any(part in key for part in MILLISECOND_FIGURES):
        return key[: -len("_s")] + "_ms", 1e3
    for suffix, readable, factor in READABLE_UNITS:
        if key.endswith(suffix):
            return key[: -len(suffix)] + readable, factor
    return key, 1.0
