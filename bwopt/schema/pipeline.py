"""Schemas of conf/pipeline/: every tf.data knob."""

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from bwopt.schema.checks import (
    AUTOTUNE,
    TFRECORD_COMPRESSIONS,
    TRANSFER_DTYPES,
    ConfigError,
    check_at_least,
    check_choice,
    check_int_or_autotune,
)
from bwopt.schema.devices import MULTI_PROCESS_STRATEGIES

# --- pipeline ---------------------------------------------------------------

# How encoded images are preprocessed (bwopt.preprocess builds each), and those whose training
# stage draws at random.
PREPROCESSINGS = ("none", "imagenet")
RANDOM_PREPROCESSINGS = ("imagenet",)
# Service sharding that hands each source of the pipeline to the workers apart (dynamic splits) or
# needs every source to read files (file): the stream positions that key the random stages would
# not follow the examples, or could not be sharded.
SOURCES_APART = ("distributed_epoch", "dynamic", "file")

AUTO_SHARD_POLICIES = ("AUTO", "OFF", "FILE", "DATA", "HINT")
# How elements travel from tf.data service workers to the trainer (bwopt.data.service maps each).
SERVICE_COMPRESSIONS = ("AUTO", "NONE", "SNAPPY")
# The two legacy names, and every tf.data.experimental.service.ShardingPolicy in lower case.
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
        check_choice("pipeline.tfrecord.compression", self.compression, TFRECORD_COMPRESSIONS)
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
        check_choice("pipeline.service.compression", self.compression, SERVICE_COMPRESSIONS)
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
    # Encoded images (data=images, sample_images, tfrecord with data.format=image), per element:
    # none: decode, resize; imagenet: training decode, random crop, flip, resize; validation
    # decode, center crop, resize (TF Model Garden's classification preprocessing).
    preprocess: str = "none"
    # Decode only a JPEG's crop window (tf.io.decode_and_crop_jpeg) instead of the whole image.
    fused_decode_crop: bool = True
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
        check_choice("pipeline.preprocess", self.preprocess, PREPROCESSINGS)
        if self.preprocess == "imagenet" and self.vectorized_map:
            raise ConfigError(
                "pipeline.preprocess=imagenet crops every image to its own window, so images of different "
                "sizes cannot be batched before it, as pipeline.vectorized_map=true would; set "
                "pipeline.vectorized_map=false"
            )
        self._check_random_stages_keep_their_keys()

    def _check_random_stages_keep_their_keys(self) -> None:
        """A random stage draws from the image's (or example's) identity and its epoch, the latter
        from the element's position in the repeated stream (bwopt.pipeline), so the positions must
        stay with the elements wherever the service splits the pipeline."""
        stages = random_stages(self)
        mode = self.service.processing_mode
        if stages and self.service.mode != "off" and mode in SOURCES_APART:
            raise ConfigError(
                f"pipeline.service.processing_mode={mode} with {' and '.join(stages)}: the service would split "
                "the examples and the stream positions that key their random draws apart, so a draw would "
                "depend on the worker that made it; use parallel_epochs or data"
            )


def random_stages(pipeline: "PipelineConfig") -> list:
    """The settings that put a random stage in the training pipeline, as key=value."""
    stages = [f"pipeline.preprocess={pipeline.preprocess}"] if pipeline.preprocess in RANDOM_PREPROCESSINGS else []
    return stages + ([f"pipeline.augment_repeats={pipeline.augment_repeats}"] if pipeline.augment_repeats else [])


def check_random_stages_shard(pipeline: PipelineConfig, strategy: str) -> None:
    """Across workers, tf.data shards the training pipeline by its sources (auto_shard_policy):
    the stream positions that key a random stage's draws (bwopt.pipeline) are read from no file."""
    stages = random_stages(pipeline)
    if stages and pipeline.distribute.auto_shard_policy == "FILE" and strategy in MULTI_PROCESS_STRATEGIES:
        raise ConfigError(
            f"pipeline.distribute.auto_shard_policy=FILE with {' and '.join(stages)}: the stream positions that "
            f"key the random draws come from no file, so tf.data cannot shard them by file across "
            f"strategy={strategy}'s workers; use AUTO or DATA"
        )
