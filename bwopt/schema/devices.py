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
