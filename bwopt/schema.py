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
        raise ConfigError(f"{key}={value!r} is not allowed; expected one of: {', '.join(map(str, allowed))}")


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
        raise ConfigError(f"{key}={value!r} has the wrong type; expected an integer >= {minimum} or '{AUTOTUNE}'")
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


@dataclass
class ArtificialData(DataConfig):
    """Files with known latencies, like the tf.data performance guide's ArtificialDataset.

    Opening a file sleeps `file_open_latency_s`, reading each element sleeps
    `element_latency_s`, and each train step sleeps `step_compute_s` on top of the model:
    a workload whose input and compute times are known, to check the measurements.
    """

    name: str = "artificial"
    num_files: int = 4
    examples_per_file: int = 64
    file_open_latency_s: float = 0.0
    element_latency_s: float = 0.001
    step_compute_s: float = 0.0
    feature_shape: List[int] = field(default_factory=lambda: [8])
    num_classes: int = 2

    def __post_init__(self) -> None:
        check_at_least("data.num_files", self.num_files, 2)
        check_at_least("data.examples_per_file", self.examples_per_file, 1)
        for key in ("file_open_latency_s", "element_latency_s", "step_compute_s"):
            check_at_least(f"data.{key}", getattr(self, key), 0.0)
        check_at_least("data.num_classes", self.num_classes, 2)


@dataclass
class TFRecordData(DataConfig):
    """The user's TFRecord files: a raw-bytes feature and an int64 label per tf.train.Example."""

    name: str = "tfrecord"
    # Glob of the training files, and of the validation files ('' holds out files by split).
    file_pattern: str = MISSING
    validation_file_pattern: str = ""
    compression: str = "NONE"
    feature_key: str = "features"
    feature_dtype: str = "uint8"
    feature_shape: List[int] = MISSING
    label_key: str = "label"
    num_classes: int = MISSING
    # Device-side multiplier after the cast, e.g. 1/255 for 8-bit images.
    feature_scale: float = 1.0

    def __post_init__(self) -> None:
        check_choice("data.compression", self.compression, COMPRESSIONS)
        check_choice("data.feature_dtype", self.feature_dtype, ("uint8", "int32", "int64", "float16", "float32"))
        check_at_least("data.num_classes", self.num_classes, 2)


# --- split ------------------------------------------------------------------


@dataclass
class SplitConfig:
    name: str = MISSING
    validation_fraction: float = 0.2

    def __post_init__(self) -> None:
        check_choice("split.name", self.name, ("uniform", "stratified"))
        check_fraction("split.validation_fraction", self.validation_fraction)


# --- pipeline ---------------------------------------------------------------

COMPRESSIONS = ("NONE", "GZIP", "ZLIB")
AUTO_SHARD_POLICIES = ("AUTO", "OFF", "FILE", "DATA", "HINT")
SERVICE_PROCESSING_MODES = (
    "parallel_epochs",
    "distributed_epoch",
    "off",
    "dynamic",
    "file",
    "data",
    "file_or_data",
    "hint",
)


@dataclass
class InterleaveConfig:
    """How file-backed sources (TFRecord shards, artificial files) are read in parallel."""

    # Files read at once; 'autotune' lets tf.data decide.
    cycle_length: Any = 1
    # Consecutive elements taken from one file before moving to the next.
    block_length: int = 1
    # Threads filling the cycle; 1 reads serially.
    num_parallel_calls: Any = 1

    def __post_init__(self) -> None:
        check_int_or_autotune("pipeline.interleave.cycle_length", self.cycle_length, 1)
        check_at_least("pipeline.interleave.block_length", self.block_length, 1)
        check_int_or_autotune("pipeline.interleave.num_parallel_calls", self.num_parallel_calls, 1)


@dataclass
class TFRecordConfig:
    """Materialise any source as sharded TFRecord files and read them back."""

    enabled: bool = False
    num_shards: int = 4
    compression: str = "NONE"
    # Files read in parallel by TFRecordDataset; 'autotune' or an int >= 1.
    num_parallel_reads: Any = AUTOTUNE
    # Read buffer per file in bytes; null for TensorFlow's default.
    buffer_size_bytes: Optional[int] = None
    # Shards are cached here, in a folder named by a hash of their content.
    directory: str = "outputs/tfrecord_cache"

    def __post_init__(self) -> None:
        check_at_least("pipeline.tfrecord.num_shards", self.num_shards, 1)
        check_choice("pipeline.tfrecord.compression", self.compression, COMPRESSIONS)
        check_int_or_autotune("pipeline.tfrecord.num_parallel_reads", self.num_parallel_reads, 1)
        if self.buffer_size_bytes is not None:
            check_at_least("pipeline.tfrecord.buffer_size_bytes", self.buffer_size_bytes, 1)


@dataclass
class SnapshotConfig:
    """tf.data snapshot of the preprocessed elements; an empty path turns it off."""

    path: str = ""
    compression: str = "AUTO"

    def __post_init__(self) -> None:
        check_choice("pipeline.snapshot.compression", self.compression, ("AUTO", "GZIP", "SNAPPY", "NONE"))


@dataclass
class OptionsConfig:
    """tf.data.Options of the training dataset."""

    autotune: bool = True
    # Autotuner budgets; null leaves TensorFlow's defaults.
    autotune_ram_budget_mb: Optional[int] = None
    autotune_cpu_budget: Optional[int] = None
    # 0 shares TensorFlow's inter-op pool; n gives the pipeline its own pool of n threads.
    private_threadpool_size: int = 0
    # 0 lets each op use all cores; 1 keeps ops single-threaded.
    max_intra_op_parallelism: int = 0
    map_and_batch_fusion: bool = True
    map_parallelization: bool = True
    noop_elimination: bool = True
    parallel_batch: bool = True
    inject_prefetch: bool = True
    # Slack for prefetch to reduce CPU contention with the step (for multi-device input).
    slack: bool = False

    def __post_init__(self) -> None:
        for key in ("autotune_ram_budget_mb", "autotune_cpu_budget"):
            if getattr(self, key) is not None:
                check_at_least(f"pipeline.options.{key}", getattr(self, key), 1)
        check_at_least("pipeline.options.private_threadpool_size", self.private_threadpool_size, 0)
        check_at_least("pipeline.options.max_intra_op_parallelism", self.max_intra_op_parallelism, 0)


@dataclass
class DistributeInputConfig:
    """How batches reach the replicas."""

    # experimental_distribute_dataset splits global batches; distribute_datasets_from_function
    # builds one pipeline per worker from its input context (per-replica batches, own shard).
    method: str = "experimental_distribute_dataset"
    auto_shard_policy: str = "AUTO"
    # InputOptions: prefetch batches onto the devices, and how many per replica.
    fetch_to_device: bool = True
    per_replica_buffer_size: int = 1

    def __post_init__(self) -> None:
        check_choice(
            "pipeline.distribute.method",
            self.method,
            ("experimental_distribute_dataset", "distribute_datasets_from_function"),
        )
        check_choice("pipeline.distribute.auto_shard_policy", self.auto_shard_policy, AUTO_SHARD_POLICIES)
        check_at_least("pipeline.distribute.per_replica_buffer_size", self.per_replica_buffer_size, 1)


@dataclass
class DataServiceConfig:
    """tf.data service: preprocessing on dispatcher-managed workers instead of the trainer."""

    mode: str = "off"
    # remote: the dispatcher's address, e.g. grpc://10.0.0.5:5050.
    address: str = ""
    # local: workers started in this process, addressed over 127.0.0.1.
    num_workers: int = 2
    # TensorFlow's data servers listen on every interface (0.0.0.0): a local service refuses to
    # start on a host with a non-loopback address unless this is true (or the run is inside a
    # loopback-only network namespace).
    allow_external_interfaces: bool = False
    processing_mode: str = "parallel_epochs"
    compression: str = "AUTO"
    job_name: Optional[str] = None

    def __post_init__(self) -> None:
        check_choice("pipeline.service.mode", self.mode, ("off", "local", "remote"))
        check_choice("pipeline.service.processing_mode", self.processing_mode, SERVICE_PROCESSING_MODES)
        check_choice("pipeline.service.compression", self.compression, ("AUTO", "NONE"))
        check_at_least("pipeline.service.num_workers", self.num_workers, 1)
        if self.mode == "remote" and not self.address:
            raise ConfigError("pipeline.service.mode='remote' needs pipeline.service.address (grpc://host:port)")


@dataclass
class PipelineConfig:
    name: str = MISSING
    shuffle_buffer: int = 1024
    # null shuffles with the run's seed.
    shuffle_seed: Optional[int] = None
    # Batches to prefetch: 0 disables prefetching, 'autotune' lets tf.data decide.
    prefetch: Any = AUTOTUNE
    # Parallel calls of the preprocessing map: 1 runs it serially.
    map_parallelism: Any = AUTOTUNE
    # Batch before the map, so the preprocessing runs once per batch on whole tensors.
    vectorized_map: bool = False
    deterministic: bool = True
    # Rounds of random jitter applied to every example: preprocessing cost on the host.
    augment_repeats: int = 0
    cache: str = "off"
    cache_path: str = ""
    # Host dtype of the features: the cast and normalisation happen on the device.
    transfer_dtype: str = "float32"
    interleave: InterleaveConfig = field(default_factory=InterleaveConfig)
    tfrecord: TFRecordConfig = field(default_factory=TFRecordConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    options: OptionsConfig = field(default_factory=OptionsConfig)
    distribute: DistributeInputConfig = field(default_factory=DistributeInputConfig)
    service: DataServiceConfig = field(default_factory=DataServiceConfig)

    def __post_init__(self) -> None:
        check_at_least("pipeline.shuffle_buffer", self.shuffle_buffer, 0)
        check_int_or_autotune("pipeline.prefetch", self.prefetch, 0)
        check_int_or_autotune("pipeline.map_parallelism", self.map_parallelism, 1)
        check_at_least("pipeline.augment_repeats", self.augment_repeats, 0)
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
    # Steps excluded at the start of every later epoch: during validation the input pipeline
    # fills its buffers, so the next steps get batches for free. null = warmup_steps; raise it
    # to the prefetch depth when that is larger.
    epoch_warmup_steps: Optional[int] = None
    # Steps per epoch; null for one pass over the training split.
    steps_per_epoch: Optional[int] = None
    optimizer: str = "adam"
    learning_rate: float = 1e-3

    def __post_init__(self) -> None:
        check_at_least("train.global_batch_size", self.global_batch_size, 1)
        check_at_least("train.epochs", self.epochs, 1)
        check_at_least("train.warmup_steps", self.warmup_steps, 0)
        if self.epoch_warmup_steps is not None:
            check_at_least("train.epoch_warmup_steps", self.epoch_warmup_steps, 0)
        if self.steps_per_epoch is not None:
            check_at_least("train.steps_per_epoch", self.steps_per_epoch, 1)
        check_choice("train.optimizer", self.optimizer, ("adam", "sgd", "rmsprop"))
        if self.learning_rate <= 0:
            raise ConfigError(f"train.learning_rate={self.learning_rate!r}; expected a value > 0")


@dataclass
class MeasureConfig:
    """Figures beyond the timed loop; each costs extra time, so each can be turned off."""

    # Also measure the compute ceiling (the step on batches already on the device) and the
    # input ceiling (the distributed dataset iterated alone), `ceiling_steps` steps each.
    ceilings: bool = False
    ceiling_steps: int = 100
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

    def __post_init__(self) -> None:
        check_at_least("measure.ceiling_steps", self.ceiling_steps, 2)
        check_at_least("measure.inference_batches", self.inference_batches, 2)
        check_at_least("measure.inference_warmup_batches", self.inference_warmup_batches, 0)
        if self.inference_batch_sizes and min(self.inference_batch_sizes) < 1:
            raise ConfigError(f"measure.inference_batch_sizes={self.inference_batch_sizes!r}; expected sizes >= 1")
        check_at_least("measure.profile_start_step", self.profile_start_step, 0)
        check_at_least("measure.profile_num_steps", self.profile_num_steps, 0)


MODES = ("train", "input", "inference")


@dataclass
class Config:
    # train: the timed training run; input: iterate the distributed dataset alone (the input
    # ceiling); inference: forward passes of a freshly built model.
    mode: str = "train"
    data: Any = MISSING
    split: Any = MISSING
    pipeline: Any = MISSING
    device: Any = MISSING
    strategy: Any = MISSING
    model: Any = MISSING
    tracking: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
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
    if config.split.name == "stratified" and config.data.name in ("artificial", "tfrecord"):
        raise ConfigError(
            f"split=stratified needs the labels in memory, which data={config.data.name} streams "
            "from files; use split=uniform (files are held out whole)"
        )
    if config.data.name == "artificial" and config.device.jit_compile and config.data.step_compute_s:
        raise ConfigError(
            "data.step_compute_s sleeps in Python, which XLA cannot compile; set device.jit_compile=false"
        )
    if config.num_replicas:
        check_batch_divisible(config, config.num_replicas)
    if config.mode != "train" and config.measure.ceilings:
        raise ConfigError(f"measure.ceilings=true needs mode=train (mode={config.mode} measures no training step)")
    if config.mode == "input" and config.measure.inference_batch_sizes:
        raise ConfigError("measure.inference_batch_sizes needs mode=train or mode=inference, not mode=input")


def check_batch_divisible(config: Config, num_replicas: int) -> None:
    """Every replica gets the same share of a global batch."""
    if config.train.global_batch_size % num_replicas:
        raise ConfigError(
            f"train.global_batch_size={config.train.global_batch_size} is not divisible by the "
            f"{num_replicas} replicas of strategy={config.strategy.name}; use a multiple of {num_replicas}"
        )


SCHEMAS = {
    "data": {
        "digits": DigitsData,
        "synthetic": SyntheticData,
        "artificial": ArtificialData,
        "tfrecord": TFRecordData,
    },
    "split": {"uniform": SplitConfig, "stratified": SplitConfig},
    "pipeline": {"base": PipelineConfig},
    "device": {"cpu": CpuDevice, "gpu": GpuDevice, "tpu": TpuDevice},
    "strategy": {"base": StrategyConfig},
    "model": {"mlp": MlpModel, "cnn": CnnModel},
    "tracking": {"mlflow": MlflowTracking, "none": NoTracking},
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
