"""Typed schemas of every config group, registered in Hydra's ConfigStore.

This module imports neither TensorFlow nor MLflow: a config is validated in
about a second, before anything heavy is loaded. Each YAML option under
`conf/<group>/` extends the schema stored here under `schema/<group>/<option>`,
so unknown keys and wrong types are rejected by OmegaConf's struct mode, and
value checks that a type cannot express live in `__post_init__`.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

AUTOTUNE = "autotune"
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
TRANSFER_DTYPES = ("uint8", "bfloat16", "float16", "float32")


class ConfigError(ValueError):
    """A config value is out of range or inconsistent with another one."""


def check_choice(key: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{key}={value!r} is not allowed; expected one of: {', '.join(map(str, allowed))}"
        )


def check_at_least(key: str, value, minimum) -> None:
    if value < minimum:
        raise ConfigError(f"{key}={value!r} is out of range; expected a value >= {minimum}")


def check_fraction(key: str, value: float, low_open: bool = True) -> None:
    if not (0.0 < value < 1.0 if low_open else 0.0 <= value < 1.0):
        raise ConfigError(f"{key}={value!r} is out of range; expected a fraction in (0, 1)")


def check_int_or_autotune(key: str, value: Any, minimum: int) -> None:
    if value == AUTOTUNE:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{key}={value!r} has the wrong type; expected an integer >= {minimum} or '{AUTOTUNE}'"
        )
    check_at_least(key, value, minimum)


# --- data -------------------------------------------------------------------


@dataclass
class DataConfig:
    name: str = MISSING


@dataclass
class DigitsData(DataConfig):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes)."""

    name: str = "digits"


@dataclass
class SyntheticData(DataConfig):
    """Random images with a learnable class signal, sized to stress memory bandwidth."""

    name: str = "synthetic"
    num_examples: int = 2048
    image_shape: List[int] = field(default_factory=lambda: [32, 32, 3])
    dtype: str = "uint8"
    num_classes: int = 10
    # Strength of the class-dependent mean shift (in units of the noise's spread).
    signal: float = 1.0

    def __post_init__(self) -> None:
        check_at_least("data.num_examples", self.num_examples, 2)
        check_at_least("data.num_classes", self.num_classes, 2)
        check_choice("data.dtype", self.dtype, ("uint8", "float32"))
        if not self.image_shape or min(self.image_shape) < 1:
            raise ConfigError(
                f"data.image_shape={self.image_shape!r} is invalid; expected positive sizes, e.g. [32, 32, 3]"
            )


# --- split ------------------------------------------------------------------


@dataclass
class SplitConfig:
    name: str = MISSING
    validation_fraction: float = 0.2

    def __post_init__(self) -> None:
        check_choice("split.name", self.name, ("uniform", "stratified"))
        check_fraction("split.validation_fraction", self.validation_fraction)


# --- pipeline ---------------------------------------------------------------


@dataclass
class PipelineConfig:
    name: str = MISSING
    shuffle_buffer: int = 1024
    # Batches to prefetch: 0 disables prefetching, 'autotune' lets tf.data decide.
    prefetch: Any = AUTOTUNE
    # Parallel calls of the preprocessing map: 1 runs it serially.
    map_parallelism: Any = AUTOTUNE
    deterministic: bool = True
    cache: str = "off"
    cache_path: str = ""
    # Host dtype of the features: the cast and normalisation happen on the device.
    transfer_dtype: str = "float32"

    def __post_init__(self) -> None:
        check_at_least("pipeline.shuffle_buffer", self.shuffle_buffer, 0)
        check_int_or_autotune("pipeline.prefetch", self.prefetch, 0)
        check_int_or_autotune("pipeline.map_parallelism", self.map_parallelism, 1)
        check_choice("pipeline.cache", self.cache, ("off", "memory", "file"))
        if self.cache == "file" and not self.cache_path:
            raise ConfigError("pipeline.cache='file' needs pipeline.cache_path (a file prefix)")
        check_choice("pipeline.transfer_dtype", self.transfer_dtype, TRANSFER_DTYPES)


# --- device -----------------------------------------------------------------


@dataclass
class DeviceConfig:
    name: str = MISSING
    precision: str = "float32"
    # Compile the train step with XLA.
    jit_compile: bool = False

    def __post_init__(self) -> None:
        check_choice("device.precision", self.precision, PRECISIONS)


@dataclass
class CpuDevice(DeviceConfig):
    name: str = "cpu"
    # Logical CPU devices the host CPU is split into (replicas of mirrored).
    num_cpu_devices: int = 2
    # 0 lets TensorFlow choose the thread pool sizes.
    intra_op_threads: int = 0
    inter_op_threads: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_at_least("device.num_cpu_devices", self.num_cpu_devices, 1)
        check_at_least("device.intra_op_threads", self.intra_op_threads, 0)
        check_at_least("device.inter_op_threads", self.inter_op_threads, 0)


@dataclass
class GpuDevice(DeviceConfig):
    name: str = "gpu"
    # Allocate GPU memory as needed instead of all of it at start-up.
    memory_growth: bool = True
    # Hard cap per GPU in MiB (a logical device of that size); null for none.
    memory_limit_mb: Optional[int] = None
    # Indices of the physical GPUs to use; null for all.
    visible_gpus: Optional[List[int]] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.memory_limit_mb is not None:
            check_at_least("device.memory_limit_mb", self.memory_limit_mb, 1)
            if self.memory_growth:
                raise ConfigError(
                    "device.memory_growth=true and device.memory_limit_mb are exclusive; "
                    "set device.memory_growth=false to cap memory"
                )


@dataclass
class TpuDevice(DeviceConfig):
    name: str = "tpu"
    # TPU name or grpc:// address; '' or 'local' for a TPU VM's own chips.
    tpu: str = "local"
    precision: str = "mixed_bfloat16"


# --- strategy ---------------------------------------------------------------

STRATEGIES = ("default", "one_device", "mirrored", "tpu")


@dataclass
class StrategyConfig:
    name: str = MISSING
    # one_device: the device to place on; '' picks the first device of the target.
    device: str = ""
    # mirrored: how gradients are all-reduced across replicas.
    cross_device_ops: str = "auto"

    def __post_init__(self) -> None:
        check_choice("strategy.name", self.name, STRATEGIES)
        check_choice(
            "strategy.cross_device_ops",
            self.cross_device_ops,
            ("auto", "reduction_to_one", "hierarchical_copy", "nccl"),
        )


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


# --- run --------------------------------------------------------------------


@dataclass
class TrainConfig:
    global_batch_size: int = 64
    epochs: int = 10
    # Steps excluded from every timing figure (tracing, autotuning, cache fill).
    warmup_steps: int = 5
    # Steps per epoch; null for one pass over the training split.
    steps_per_epoch: Optional[int] = None
    optimizer: str = "adam"
    learning_rate: float = 1e-3

    def __post_init__(self) -> None:
        check_at_least("train.global_batch_size", self.global_batch_size, 1)
        check_at_least("train.epochs", self.epochs, 1)
        check_at_least("train.warmup_steps", self.warmup_steps, 0)
        if self.steps_per_epoch is not None:
            check_at_least("train.steps_per_epoch", self.steps_per_epoch, 1)
        check_choice("train.optimizer", self.optimizer, ("adam", "sgd", "rmsprop"))
        if self.learning_rate <= 0:
            raise ConfigError(f"train.learning_rate={self.learning_rate!r}; expected a value > 0")


@dataclass
class Config:
    data: Any = MISSING
    split: Any = MISSING
    pipeline: Any = MISSING
    device: Any = MISSING
    strategy: Any = MISSING
    model: Any = MISSING
    tracking: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        check_valid_combination(self)

    @property
    def num_replicas(self) -> Optional[int]:
        """Replicas the strategy will have, when known without asking TensorFlow."""
        if self.strategy.name in ("default", "one_device"):
            return 1
        if self.device.name == "cpu":
            return self.device.num_cpu_devices
        if self.device.name == "gpu" and self.device.visible_gpus is not None:
            return len(self.device.visible_gpus)
        return None


def check_valid_combination(config: Config) -> None:
    """Cross-group checks: what no single group can tell on its own."""
    if (config.strategy.name == "tpu") != (config.device.name == "tpu"):
        raise ConfigError(
            f"strategy={config.strategy.name} with device={config.device.name}: "
            "strategy=tpu needs device=tpu and device=tpu needs strategy=tpu"
        )
    if config.device.name == "cpu" and config.device.precision == "mixed_float16":
        raise ConfigError(
            "device.precision='mixed_float16' is slow and unsupported on CPU; "
            "use 'float32' or 'mixed_bfloat16' with device=cpu"
        )
    num_replicas = config.num_replicas
    if num_replicas and config.train.global_batch_size % num_replicas:
        raise ConfigError(
            f"train.global_batch_size={config.train.global_batch_size} is not divisible by the "
            f"{num_replicas} replicas of strategy={config.strategy.name}; "
            f"use a multiple of {num_replicas}"
        )


SCHEMAS = {
    "data": {"digits": DigitsData, "synthetic": SyntheticData},
    "split": {"uniform": SplitConfig, "stratified": SplitConfig},
    "pipeline": {"base": PipelineConfig},
    "device": {"cpu": CpuDevice, "gpu": GpuDevice, "tpu": TpuDevice},
    "strategy": {"base": StrategyConfig},
    "model": {"mlp": MlpModel, "cnn": CnnModel},
    "tracking": {"mlflow": MlflowTracking, "none": NoTracking},
}


def unknown_key_message(override: str) -> Optional[str]:
    """Why a command-line `group.key=value` names no key, listing the keys that exist.

    OmegaConf rejects unknown keys too; this says which keys the group does have.
    """
    key = override.split("=", 1)[0]
    if "=" not in override or key.startswith(("+", "~", "hydra", "-")) or "." not in key:
        return None
    group, name = key.split(".")[:2]
    schemas = {"train": [TrainConfig]}.get(group) or list(SCHEMAS.get(group, {}).values())
    if not schemas:
        return None
    names = sorted({field.name for schema in schemas for field in dataclasses.fields(schema)})
    if name in names:
        return None
    return f"{group}.{name} is not a key of '{group}'; its keys are: {', '.join(names)}"


def register_configs() -> None:
    """Store the schemas under `schema/` so the YAML options can extend them."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=schema)
