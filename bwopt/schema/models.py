"""Schemas of conf/model/."""

from dataclasses import dataclass, field
from typing import List

from omegaconf import MISSING

from bwopt.schema.checks import ConfigError, check_at_least, check_fraction

# --- model ------------------------------------------------------------------


@dataclass
class ModelConfig:
    name: str = MISSING


@dataclass
class MlpModel(ModelConfig):
    name: str = "mlp"
    hidden_units: List[int] = field(default_factory=lambda: [128])
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not self.hidden_units or min(self.hidden_units) < 1:
            raise ConfigError(f"model.hidden_units={self.hidden_units!r}; expected positive layer sizes")
        check_fraction("model.dropout", self.dropout, low_open=False)


@dataclass
class CnnModel(ModelConfig):
    name: str = "cnn"
    filters: List[int] = field(default_factory=lambda: [16, 32])
    kernel_size: int = 3
    dense_units: int = 64

    def __post_init__(self) -> None:
        if not self.filters or min(self.filters) < 1:
            raise ConfigError(f"model.filters={self.filters!r}; expected positive filter counts")
        check_at_least("model.kernel_size", self.kernel_size, 1)
        check_at_least("model.dense_units", self.dense_units, 1)
