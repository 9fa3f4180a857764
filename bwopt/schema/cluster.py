"""Schemas of conf/cluster/: which processes take part in a run and how they find each other."""

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from bwopt.schema.checks import ConfigError, check_at_least


@dataclass
class ClusterConfig:
    name: str = MISSING


@dataclass
class NoCluster(ClusterConfig):
    """One process: strategies that stay on one host."""

    name: str = "none"


@dataclass
class LocalCluster(ClusterConfig):
    """bwopt starts the tasks itself, as processes on this host, on free 127.0.0.1 ports."""

    name: str = "local"
    # Workers to start; strategy=parameter_server adds strategy.num_ps servers and a chief.
    num_workers: int = 2
    # Seconds a stopped task gets to end on its own after SIGTERM before it is killed.
    stop_grace_s: float = 5.0
    # TensorFlow's gRPC servers bind every interface; bwopt rebinds them to 127.0.0.1 with a small
    # LD_PRELOAD library (built with the C compiler). Without one it refuses on a host with a
    # non-loopback address, unless this is true.
    allow_external_interfaces: bool = False

    def __post_init__(self) -> None:
        check_at_least("cluster.num_workers", self.num_workers, 1)
        if not self.stop_grace_s > 0:
            raise ConfigError(f"cluster.stop_grace_s={self.stop_grace_s!r}; expected seconds > 0")


@dataclass
class TFConfigCluster(ClusterConfig):
    """The TF_CONFIG environment variable, as Kubernetes TFJob, Vertex AI or a hand-made cluster set it."""

    name: str = "tf_config"


@dataclass
class SlurmCluster(ClusterConfig):
    """tf.distribute.cluster_resolver.SlurmClusterResolver inside an `sbatch`/`srun` allocation."""

    name: str = "slurm"
    # First port of each node's tasks (port_base, port_base + 1, ...).
    port_base: int = 8888
    # GPUs per node; null lets the resolver ask nvidia-smi (0 on CPU-only nodes).
    gpus_per_node: Optional[int] = None
    gpus_per_task: Optional[int] = None

    def __post_init__(self) -> None:
        check_at_least("cluster.port_base", self.port_base, 1024)
