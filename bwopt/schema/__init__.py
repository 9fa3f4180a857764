"""Typed schemas of every config group, registered in Hydra's ConfigStore.

This package imports neither TensorFlow nor MLflow: a config is validated in
about a second, before anything heavy is loaded. Each YAML option under
`conf/<group>/` extends the schema stored here under `schema/<group>/<option>`,
so unknown keys and wrong types are rejected by OmegaConf's struct mode, and
value checks that a type cannot express live in `__post_init__`.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from bwopt.schema.checks import (
    AUTOTUNE,
    PRECISIONS,
    TFRECORD_COMPRESSIONS,
    TRANSFER_DTYPES,
    ConfigError,
    check_at_least,
    check_choice,
    check_fraction,
    check_int_or_autotune,
)
from bwopt.schema.cluster import (
    ClusterConfig,
    LocalCluster,
    NoCluster,
    SlurmCluster,
    TFConfigCluster,
    check_cluster,
)
from bwopt.schema.data import (
    DATA_SCHEMAS,
    SPLITS,
    ArtificialData,
    DataConfig,
    DigitsData,
    SplitConfig,
    SyntheticData,
    TFRecordData,
    check_data_combination,
)
from bwopt.schema.devices import (
    COMMUNICATIONS,
    CROSS_DEVICE_OPS,
    MULTI_PROCESS_STRATEGIES,
    CpuDevice,
    DefaultStrategy,
    DeviceConfig,
    GpuDevice,
    MirroredStrategy,
    ModelParallelStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    ParameterServerStrategy,
    StrategyConfig,
    TpuDevice,
    TpuStrategy,
)
from bwopt.schema.models import CnnModel, CustomModel, KerasAppModel, MlpModel, ModelConfig, check_model_with_strategy
from bwopt.schema.pipeline import (
    AUTO_SHARD_POLICIES,
    SERVICE_COMPRESSIONS,
    SERVICE_PROCESSING_MODES,
    DataServiceConfig,
    DistributeInputConfig,
    InterleaveConfig,
    OptionsConfig,
    PipelineConfig,
    SnapshotConfig,
    TFRecordConfig,
    check_random_stages_shard,
)
from bwopt.schema.run import MODES, OPTIMIZERS, MeasureConfig, TrainConfig
from bwopt.schema.sweep import SweepConfig
from bwopt.schema.tracking import MlflowTracking, NoTracking, TrackingConfig

__all__ = [
    "AUTOTUNE",
    "AUTO_SHARD_POLICIES",
    "ArtificialData",
    "COMMUNICATIONS",
    "CROSS_DEVICE_OPS",
    "ClusterConfig",
    "LocalCluster",
    "MULTI_PROCESS_STRATEGIES",
    "MultiWorkerMirroredStrategy",
    "NoCluster",
    "ParameterServerStrategy",
    "SlurmCluster",
    "TFConfigCluster",
    "CnnModel",
    "Config",
    "ConfigError",
    "CpuDevice",
    "CustomModel",
    "DataConfig",
    "DataServiceConfig",
    "DeviceConfig",
    "DigitsData",
    "DistributeInputConfig",
    "GpuDevice",
    "InterleaveConfig",
    "KerasAppModel",
    "MODES",
    "MeasureConfig",
    "MlflowTracking",
    "MlpModel",
    "ModelConfig",
    "NoTracking",
    "OptionsConfig",
    "PRECISIONS",
    "PipelineConfig",
    "SCHEMAS",
    "OPTIMIZERS",
    "SERVICE_COMPRESSIONS",
    "SERVICE_PROCESSING_MODES",
    "SPLITS",
    "SnapshotConfig",
    "SplitConfig",
    "StrategyConfig",
    "SweepConfig",
    "SyntheticData",
    "TFRecordConfig",
    "TFRECORD_COMPRESSIONS",
    "TFRecordData",
    "TRANSFER_DTYPES",
    "TpuDevice",
    "TrackingConfig",
    "TrainConfig",
    "check_at_least",
    "check_batch_divisible",
    "check_choice",
    "check_fraction",
    "check_int_or_autotune",
    "check_valid_combination",
    "register_configs",
    "unknown_key_message",
]


@dataclass
class Config:
    mode: str = "train"
    data: Any = MISSING
    split: Any = MISSING
    pipeline: Any = MISSING
    device: Any = MISSING
    strategy: Any = MISSING
    model: Any = MISSING
    tracking: Any = MISSING
    cluster: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    seed: int = 0
    # Show everything TensorFlow and MLflow print (bwopt.quiet hides their start-up chatter).
    verbose: bool = False

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        check_at_least("seed", self.seed, 0)
        for group, options in SCHEMAS.items():  # `group.name=x` set directly must still name an option
            if group != "pipeline":  # pipeline presets share one schema; their names are free
                check_choice(f"{group}.name", getattr(self, group).name, tuple(options))
        check_valid_combination(self)

    @property
    def num_replicas(self) -> Optional[int]:
        """Replicas the strategy will have, when known without asking TensorFlow."""
        if self.strategy.name in ("default", "one_device", "parameter_server", "model_parallel"):
            return 1  # parameter_server: one replica per step, the workers' steps are asynchronous
        if self.strategy.name == "multi_worker_mirrored":
            # One replica per worker on CPUs (TensorFlow uses one CPU device per worker).
            local = self.cluster.name == "local" and self.device.name == "cpu"
            return self.cluster.num_workers if local else None
        if self.device.name == "cpu":
            return self.device.num_cpu_devices
        if self.device.name == "gpu" and self.device.visible_gpus is not None:
            return len(self.device.visible_gpus)
        return None


def check_valid_combination(config: Config) -> None:
    """Cross-group checks: what no single group can tell on its own."""
    if config.strategy.name == "model_parallel" and config.device.name == "cpu":
        if config.strategy.num_stages > config.device.num_cpu_devices:
            raise ConfigError(
                f"strategy.num_stages={config.strategy.num_stages} needs as many devices, but "
                f"device.num_cpu_devices={config.device.num_cpu_devices}; raise it or use fewer stages"
            )
    check_model_with_strategy(config.model, config.strategy.name)
    if (config.strategy.name == "tpu") != (config.device.name == "tpu"):
        raise ConfigError(
            f"strategy={config.strategy.name} with device={config.device.name}: "
            "strategy=tpu needs device=tpu and device=tpu needs strategy=tpu"
        )
    if config.strategy.name == "parameter_server" and config.train.steps_per_execution > 1:
        raise ConfigError(
            f"train.steps_per_execution={config.train.steps_per_execution} with strategy=parameter_server: "
            "each scheduled closure runs one step on a worker; use 1"
        )
    if config.device.name == "cpu" and config.device.precision == "mixed_float16":
        raise ConfigError(
            "device.precision='mixed_float16' is slow and unsupported on CPU; "
            "use 'float32' or 'mixed_bfloat16' with device=cpu"
        )
    if config.split.name == "stratified" and config.data.name in ("artificial", "tfrecord"):
        raise ConfigError(
            f"split=stratified needs the labels in memory, which data={config.data.name} streams "
            "from files; use split=uniform (files are held out whole)"
        )
    if config.data.name == "artificial" and config.device.jit_compile and config.data.step_compute_s:
        raise ConfigError(
            "data.step_compute_s sleeps in Python, which XLA cannot compile; set device.jit_compile=false"
        )
    check_data_combination(config)
    check_cluster(config.strategy.name, config.cluster.name, config.device.name)
    check_random_stages_shard(config.pipeline, config.strategy.name)
    if config.num_replicas:
        check_batch_divisible(config, config.num_replicas)
    if config.mode != "train" and config.measure.ceilings:
        raise ConfigError(f"measure.ceilings=true needs mode=train (mode={config.mode} measures no training step)")
    if config.mode == "inference" and not config.measure.inference_batch_sizes:
        raise ConfigError("mode=inference needs measure.inference_batch_sizes, e.g. [1,32,256]")
    if config.mode == "input" and config.measure.inference_batch_sizes:
        raise ConfigError("measure.inference_batch_sizes needs mode=train or mode=inference, not mode=input")


def check_batch_divisible(config: Config, num_replicas: int) -> None:
    """Every replica gets the same share of a global batch."""
    if config.train.global_batch_size % num_replicas:
        # Name the key the replica count comes from too: either key may be the one to change.
        source = f" (device.num_cpu_devices={config.device.num_cpu_devices})" if config.device.name == "cpu" else ""
        raise ConfigError(
            f"train.global_batch_size={config.train.global_batch_size} is not divisible by the "
            f"{num_replicas} replicas of strategy={config.strategy.name}{source}; use a multiple of {num_replicas}"
        )


SCHEMAS = {
    "data": DATA_SCHEMAS,
    "split": {"uniform": SplitConfig, "stratified": SplitConfig},
    "pipeline": {"base": PipelineConfig},
    "device": {"cpu": CpuDevice, "gpu": GpuDevice, "tpu": TpuDevice},
    "strategy": {
        "default": DefaultStrategy,
        "one_device": OneDeviceStrategy,
        "mirrored": MirroredStrategy,
        "model_parallel": ModelParallelStrategy,
        "tpu": TpuStrategy,
        "multi_worker_mirrored": MultiWorkerMirroredStrategy,
        "parameter_server": ParameterServerStrategy,
    },
    "model": {"mlp": MlpModel, "cnn": CnnModel, "keras_app": KerasAppModel, "custom": CustomModel},
    "tracking": {"mlflow": MlflowTracking, "none": NoTracking},
    "cluster": {"none": NoCluster, "local": LocalCluster, "tf_config": TFConfigCluster, "slurm": SlurmCluster},
}


def unknown_key_message(override: str) -> Optional[str]:
    """Why a command-line `group.key=value` names no key, listing the keys that exist.

    OmegaConf rejects unknown keys too; this also says which keys the group does have,
    following nested sections such as `pipeline.interleave.cycle_length`.
    """
    key = override.split("=", 1)[0]
    if "=" not in override or key.startswith(("+", "~", "hydra", "-")) or "." not in key:
        return None
    group, *path = key.split(".")
    schemas = {"train": [TrainConfig], "measure": [MeasureConfig]}.get(group) or list(SCHEMAS.get(group, {}).values())
    section = group
    for name in path:
        fields = {field.name: field for schema in schemas for field in dataclasses.fields(schema)}
        if not fields:
            return None
        if name not in fields:
            return f"{section}.{name} is not a key of '{section}'; its keys are: {', '.join(sorted(fields))}"
        schemas = [fields[name].type] if dataclasses.is_dataclass(fields[name].type) else []
        section = f"{section}.{name}"
    return None


def register_configs() -> None:
    """Store the schemas under `schema/` so the YAML options can extend them."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=schema)
