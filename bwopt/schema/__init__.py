"""Typed schemas of every config group, registered in Hydra's ConfigStore.

This package imports neither TensorFlow nor MLflow: a config is validated in
about a second, before anything heavy is loaded. Each YAML option under
`conf/<group>/` extends the schema stored here under `schema/<group>/<option>`,
so unknown keys and wrong types are rejected by OmegaConf's struct mode, and
value checks that a type cannot express live in `__post_init__`.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional

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


# --- run --------------------------------------------------------------------

# Each choice list lives here once, as names; the module that builds the choice keys its table
# of builders by the same names (tests/test_schema.py checks that they agree).
OPTIMIZERS = ("adam", "sgd", "rmsprop")
# train: the timed training run; input: iterate the distributed dataset alone (the input
# ceiling); inference: forward passes of a freshly built model (bwopt.modes).
MODES = ("train", "input", "inference")


@dataclass
class TrainConfig:
    global_batch_size: int = 64
    epochs: int = 10
    # Steps excluded from every timing figure (tracing, autotuning, cache fill).
    warmup_steps: int = 5
    # Steps excluded at the start of every later epoch: during validation the input pipeline
    # fills its buffers, so the next steps get batches for free. null = warmup_steps; raise it
    # to the prefetch depth when that is larger.
    epoch_warmup_steps: Optional[int] = None
    # Steps per epoch; null for one pass over the training split.
    steps_per_epoch: Optional[int] = None
    # Training steps per compiled call (Keras's name): N > 1 loops over the distributed iterator
    # inside one tf.function and reads results on the host once per call, so the host's fixed cost
    # per step (fetch, dispatch, sync) is paid once per N steps; each epoch runs a whole number of calls.
    steps_per_execution: int = 1
    # Stop the run, FAILED, at the first NaN or infinite loss (Keras's TerminateOnNaN).
    terminate_on_nan: bool = True
    # Continue the most recent run of the same command that a signal stopped (bwopt.checkpoint);
    # a run folder (hydra.run.dir) that holds a stopped run's checkpoint is resumed in any case.
    resume: bool = False
    # Write that checkpoint when a signal stops a training run.
    checkpoint_on_stop: bool = True
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    lr_schedule: str = "constant"  # or cosine: from learning_rate to 0 over the run's training steps

    def __post_init__(self) -> None:
        check_at_least("train.global_batch_size", self.global_batch_size, 1)
        check_at_least("train.epochs", self.epochs, 1)
        check_at_least("train.warmup_steps", self.warmup_steps, 0)
        if self.epoch_warmup_steps is not None:
            check_at_least("train.epoch_warmup_steps", self.epoch_warmup_steps, 0)
        if self.steps_per_epoch is not None:
            check_at_least("train.steps_per_epoch", self.steps_per_epoch, 1)
        check_at_least("train.steps_per_execution", self.steps_per_execution, 1)
        if self.steps_per_epoch is not None and self.steps_per_epoch % self.steps_per_execution:
            raise ConfigError(
                f"train.steps_per_epoch={self.steps_per_epoch} is not a multiple of train.steps_per_execution="
                f"{self.steps_per_execution}; every epoch runs whole executions, so use a multiple of it"
            )
        check_choice("train.optimizer", self.optimizer, OPTIMIZERS)
        check_choice("train.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        if self.learning_rate <= 0:
            raise ConfigError(f"train.learning_rate={self.learning_rate!r}; expected a value > 0")


@dataclass
class MeasureConfig:
    """Figures beyond the timed loop; each costs extra time, so each can be turned off."""

    # Also measure the compute ceiling (the step on batches already on the device) and the
    # input ceiling (the distributed dataset iterated alone), `ceiling_steps` steps each, split
    # into `ceiling_blocks` alternating blocks (median and spread over the blocks).
    ceilings: bool = False
    ceiling_steps: int = 100
    ceiling_blocks: int = 5
    # Host memcpy bandwidth, the physical reference for bytes/s.
    memcpy_bandwidth: bool = True
    # Inference throughput and latency for these batch sizes after training ([] = off).
    inference_batch_sizes: List[int] = field(default_factory=list)
    inference_batches: int = 20
    # Forward passes per batch size left out of the figures (tracing for the new shape).
    inference_warmup_batches: int = 2
    # Capture a TensorFlow profile of steps [profile_start_step, + profile_num_steps); 0 = off.
    profile_start_step: int = 10
    profile_num_steps: int = 0
    # A live progress bar on interactive terminals.
    progress: bool = True
    # PNG plots of the step times (and of the ceilings) in the run folder and in MLflow.
    plots: bool = True
    # The timed window lasts at least this long: after the epochs, more training steps are timed
    # until it does (their updates come after the reported epoch metrics); 0 = the epochs only.
    min_timed_s: float = 3.0

    def __post_init__(self) -> None:
        check_at_least("measure.ceiling_steps", self.ceiling_steps, 2)
        check_at_least("measure.min_timed_s", self.min_timed_s, 0.0)
        check_at_least("measure.ceiling_blocks", self.ceiling_blocks, 1)
        if self.ceiling_steps < 2 * self.ceiling_blocks:
            raise ConfigError(
                f"measure.ceiling_steps={self.ceiling_steps} gives fewer than 2 steps to each of the "
                f"measure.ceiling_blocks={self.ceiling_blocks} blocks; raise ceiling_steps or lower ceiling_blocks"
            )
        check_at_least("measure.inference_batches", self.inference_batches, 2)
        check_at_least("measure.inference_warmup_batches", self.inference_warmup_batches, 0)
        if self.inference_batch_sizes and min(self.inference_batch_sizes) < 1:
            raise ConfigError(f"measure.inference_batch_sizes={self.inference_batch_sizes!r}; expected sizes >= 1")
        check_at_least("measure.profile_start_step", self.profile_start_step, 0)
        check_at_least("measure.profile_num_steps", self.profile_num_steps, 0)


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
