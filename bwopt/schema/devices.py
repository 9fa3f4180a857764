"""Schemas of conf/device/ and conf/strategy/."""

from dataclasses import dataclass
from typing import List, Optional

from omegaconf import MISSING

from bwopt.schema.checks import PRECISIONS, ConfigError, check_at_least, check_choice

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

# How mirrored all-reduces gradients across replicas (bwopt.strategies builds each).
CROSS_DEVICE_OPS = ("auto", "reduction_to_one", "hierarchical_copy", "nccl")
# The collective implementation of multi_worker_mirrored (tf.distribute.experimental.CommunicationImplementation).
COMMUNICATIONS = ("auto", "ring", "nccl")
# Strategies whose replicas live in several processes: they need a cluster (conf/cluster/).
MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")


@dataclass
class StrategyConfig:
    name: str = MISSING


@dataclass
class DefaultStrategy(StrategyConfig):
    name: str = "default"


@dataclass
class OneDeviceStrategy(StrategyConfig):
    name: str = "one_device"
    # The device to place on; '' picks the first device of the target.
    device: str = ""


@dataclass
class MirroredStrategy(StrategyConfig):
    name: str = "mirrored"
    cross_device_ops: str = "auto"

    def __post_init__(self) -> None:
        check_choice("strategy.cross_device_ops", self.cross_device_ops, CROSS_DEVICE_OPS)


@dataclass
class TpuStrategy(StrategyConfig):
    name: str = "tpu"


@dataclass
class ModelParallelStrategy(StrategyConfig):
    """One replica whose layers are split into `num_stages` consecutive groups, each on its own
    device of the target (the first `num_stages` ones): a simple pipeline of stages, to set against
    data parallelism on the same model."""

    name: str = "model_parallel"
    num_stages: int = 2

    def __post_init__(self) -> None:
        check_at_least("strategy.num_stages", self.num_stages, 2)


@dataclass
class MultiWorkerMirroredStrategy(StrategyConfig):
    """Synchronous data parallelism across the workers of a cluster (collective all-reduce)."""

    name: str = "multi_worker_mirrored"
    communication: str = "auto"
    # Gradients are packed into all-reduces of about this many bytes; 0 lets TensorFlow choose.
    bytes_per_pack: int = 0
    # Seconds a collective may wait for its peers before failing; null waits forever.
    timeout_s: Optional[float] = 300.0

    def __post_init__(self) -> None:
        check_choice("strategy.communication", self.communication, COMMUNICATIONS)
        check_at_least("strategy.bytes_per_pack", self.bytes_per_pack, 0)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"strategy.timeout_s={self.timeout_s!r}; expected seconds > 0 or null")


@dataclass
class ParameterServerStrategy(StrategyConfig):
    """Asynchronous training: variables on parameter servers, steps scheduled on workers by a coordinator."""

    name: str = "parameter_server"
    # Parameter-server tasks (cluster=local starts them; other clusters must have this many `ps` tasks).
    num_ps: int = 1
    # Variables are split into shards of at least this many bytes, at most max_shards of them
    # (tf.distribute.experimental.partitioners.MinSizePartitioner); max_shards: 1 = no partitioning.
    min_shard_bytes: int = 262144
    max_shards: int = 1
    # The coordinator waits for every scheduled step (ClusterCoordinator.join) after this many
    # steps; null = once per epoch. Smaller bounds how far workers run ahead of each other.
    steps_per_join: Optional[int] = None

    def __post_init__(self) -> None:
        check_at_least("strategy.num_ps", self.num_ps, 1)
        check_at_least("strategy.min_shard_bytes", self.min_shard_bytes, 1)
        check_at_least("strategy.max_shards", self.max_shards, 1)
        if self.steps_per_join is not None:
            check_at_least("strategy.steps_per_join", self.steps_per_join, 1)
