"""Schemas of conf/cluster/: which processes take part in a run and how they find each other."""

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from bwopt.schema.checks import ConfigError, check_at_least
from bwopt.schema.devices import MULTI_PROCESS_STRATEGIES


@dataclass
class ClusterConfig:
    name: str = MISSING
    # Seconds a task waits for the other tasks of its cluster to start (a task that never starts would
    # hold TensorFlow's start-up forever); then it ends naming the tasks that did not answer.
    startup_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.startup_timeout_s > 0:
            raise ConfigError(f"cluster.startup_timeout_s={self.startup_timeout_s!r}; expected seconds > 0")


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
    # After Ctrl-C or SIGTERM, seconds the chief gets to end its run KILLED with what it measured
    # (summary.json, checkpoint, MLflow) before the other tasks are stopped.
    chief_stop_s: float = 60.0
    # TensorFlow's gRPC servers bind every interface; bwopt rebinds them to 127.0.0.1 with a small
    # LD_PRELOAD library (built with the C compiler). Without one it refuses on a host with a
    # non-loopback address, unless this is true.
    allow_external_interfaces: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_at_least("cluster.num_workers", self.num_workers, 1)
        for key in ("stop_grace_s", "chief_stop_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"cluster.{key}={getattr(self, key)!r}; expected seconds > 0")


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
        super().__post_init__()
        check_at_least("cluster.port_base", self.port_base, 1024)


def check_cluster(strategy: str, cluster: str, device: str) -> None:
    """A strategy that spans processes needs a cluster, and a cluster needs such a strategy."""
    if strategy in MULTI_PROCESS_STRATEGIES and cluster == "none":
        raise ConfigError(
            f"strategy={strategy} runs across processes and needs a cluster; "
            "use cluster=local (bwopt starts them here), cluster=tf_config or cluster=slurm"
        )
    if cluster != "none" and strategy not in MULTI_PROCESS_STRATEGIES:
        raise ConfigError(
            f"cluster={cluster} with strategy={strategy}: a cluster needs a multi-process strategy; "
            f"use strategy={' or strategy='.join(MULTI_PROCESS_STRATEGIES)}, or cluster=none"
        )
    if cluster != "none" and device == "tpu":
        raise ConfigError(f"cluster={cluster} with device=tpu: TPU pods are reached through strategy=tpu, cluster=none")
