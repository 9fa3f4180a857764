"""Schemas of conf/tracking/."""

from dataclasses import dataclass, field
from typing import Dict, Optional

from omegaconf import MISSING

# --- tracking ---------------------------------------------------------------


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


@dataclass
class NoTracking(TrackingConfig):
    name: str = "none"
