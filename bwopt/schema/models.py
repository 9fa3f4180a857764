"""Schemas of conf/model/."""

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from bwopt.schema.checks import ConfigError, check_at_least, check_fraction
from bwopt.schema.targets import check_target

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


# bwopt's own models: their builders give layers, which strategy=model_parallel splits into stages.
# The others give a whole keras.Model, which runs on every replica as it is.
STAGED_MODELS = ("mlp", "cnn")
# Set by bwopt from the data; model.kwargs must leave them alone.
KERAS_APP_RESERVED = ("include_top", "weights", "input_shape", "input_tensor", "classes", "classifier_activation")
CUSTOM_RESERVED = ("input_shape", "num_classes")


def check_kwargs(kwargs: Dict[str, Any], reserved) -> None:
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"model.kwargs key {key!r} is not a keyword argument name; expected an identifier")
        if key in reserved:
            raise ConfigError(
                f"model.kwargs.{key} is set by bwopt from the data (it sets {', '.join(reserved)}); remove it"
            )


@dataclass
class KerasAppModel(ModelConfig):
    """A model of `keras.applications` by its class name, with its classifier head for the data's classes."""

    name: str = "keras_app"
    application: str = "MobileNetV2"
    # null: random initial weights. No download happens: another value must be a local weights file.
    weights: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # The momentum of every BatchNormalization layer's moving statistics; null keeps the
    # application's own (0.99 or 0.999, made for ImageNet's thousands of steps per epoch).
    batchnorm_momentum: Optional[float] = None

    def __post_init__(self) -> None:
        if self.batchnorm_momentum is not None and not 0.0 <= self.batchnorm_momentum < 1.0:
            raise ConfigError(
                f"model.batchnorm_momentum={self.batchnorm_momentum!r} is out of range; expected null "
                "(the application's own) or a value in [0, 1), e.g. 0.9"
            )
        # Whether keras.applications has it needs Keras: checked when the model is built.
        if not self.application or not self.application.isidentifier():
            raise ConfigError(
                f"model.application={self.application!r}; expected the name of a keras.applications model, "
                "e.g. ResNet50, MobileNetV2, EfficientNetB0"
            )
        if self.weights is not None and not os.path.isfile(self.weights):
            raise ConfigError(
                f"model.weights={self.weights!r} is not a local file, and bwopt downloads no weights; "
                "use null (random initial weights) or the path of a weights file, e.g. resnet50.weights.h5"
            )
        check_kwargs(self.kwargs, KERAS_APP_RESERVED)


@dataclass
class CustomModel(ModelConfig):
    """Your own model: `_target_` names a function that takes `input_shape=`, `num_classes=` and
    `**kwargs` and returns a `keras.Model` giving a (batch, num_classes) output of logits."""

    name: str = "custom"
    _target_: str = MISSING
    kwargs: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Importable and defined, read without running it; what it returns is checked once built.
        check_target("model._target_", self._target_)
        check_kwargs(self.kwargs, CUSTOM_RESERVED)


def check_model_with_strategy(model: ModelConfig, strategy_name: str) -> None:
    """strategy=model_parallel splits a model's layers into stages, which only bwopt's own models have."""
    if strategy_name == "model_parallel" and model.name not in STAGED_MODELS:
        raise ConfigError(
            f"strategy=model_parallel with model={model.name}: only bwopt's own layer stacks "
            f"(model={' or model='.join(STAGED_MODELS)}) can be split into stages; use another strategy "
            "(e.g. strategy=mirrored) or one of those models"
        )
