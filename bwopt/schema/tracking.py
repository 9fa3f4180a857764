"""Schemas of conf/tracking/."""

import re
from dataclasses import dataclass, field
from typing import Dict, Optional

from omegaconf import MISSING

from bwopt.redact import redact_text
from bwopt.schema.checks import ConfigError

# --- tracking ---------------------------------------------------------------

# MLflow's rule for metric, param and tag names.
TAG_KEY = re.compile(r"[\w\-./ ]{1,250}")
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "databricks", "databricks-uc", "postgresql", "mysql", "mssql")


def check_tracking_uri(uri: str) -> None:
    """A URI MLflow can open: a scheme it knows (sqlite:///path needs three slashes), or a local path."""
    shown = redact_text(uri)
    scheme, separator, rest = uri.partition(":")
    if not separator or "/" in scheme or len(scheme) == 1:  # a plain or Windows path: MLflow's file store
        if not uri.strip():
            raise ConfigError("tracking.uri='' names no store; e.g. sqlite:///outputs/mlflow.db or http://host:5000")
        return
    base = scheme.split("+")[0]
    if base not in TRACKING_SCHEMES:
        raise ConfigError(
            f"tracking.uri={uri!r}: unknown scheme {scheme!r}; expected one of: {', '.join(TRACKING_SCHEMES)}"
        )
    if base == "sqlite" and not rest.startswith("///"):
        raise ConfigError(
            f"tracking.uri={uri!r}: a sqlite store is sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    if base in ("http", "https") and not rest.startswith("//") or base in ("http", "https") and len(rest) <= 2:
        raise ConfigError(f"tracking.uri={shown!r}: expected {base}://host:port")


@dataclass
class TrackingConfig:
    name: str = MISSING


@dataclass
class MlflowTracking(TrackingConfig):
    name: str = "mlflow"
    uri: str = "sqlite:///outputs/mlflow.db"
    experiment: str = "bwopt"
    run_name: Optional[str] = None
    tags: Dict[str, str] = field(default_factory=dict)
    # MLflow's sampler of CPU, memory, disk, network and GPU use, every interval (system/... metrics).
    system_metrics: bool = True
    system_metrics_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.experiment.strip():
            raise ConfigError("tracking.experiment='' names no experiment; give it a name, e.g. bwopt")
        check_tracking_uri(self.uri)
        for key in self.tags:
            if not TAG_KEY.fullmatch(key):
                raise ConfigError(
                    f"tracking.tags key {key!r} is refused by MLflow; use letters, digits and _ - . / space "
                    "(at most 250 characters)"
                )
        if not self.system_metrics_interval_s > 0:
            raise ConfigError(
                f"tracking.system_metrics_interval_s={self.system_metrics_interval_s!r}; expected seconds > 0"
            )


@dataclass
class NoTracking(TrackingConfig):
    name: str = "none"
