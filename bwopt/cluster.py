"""Which cluster this process is a task of (conf/cluster/), found before and as TensorFlow starts.

    cluster=none       one process (every single-host strategy)
    cluster=local      bwopt starts the tasks here (bwopt.launch), on free 127.0.0.1 ports, each with its TF_CONFIG
    cluster=tf_config  the tasks were started by someone else (Kubernetes TFJob, Vertex AI, by hand)
    cluster=slurm      the tasks are the srun tasks of a SLURM allocation (SlurmClusterResolver)

Before a task joins TensorFlow's runtime (whose start-up waits for every task in C++, holding
the interpreter: no timeout, no signal), `wait_for_peers` waits in Python, bounded by
`cluster.startup_timeout_s`, until the tasks it will talk to listen on their ports; it listens on
its own meanwhile, so the tasks see each other whatever their order. A malformed TF_CONFIG or a
SLURM step without SLURM's variables is refused before TensorFlow starts (`check_environment`).

Every task runs the same config. Under multi_worker_mirrored every task is a worker and runs the
whole training (worker 0 is the chief); under parameter_server the chief runs the training and
schedules its steps on the workers, while `worker` and `ps` tasks only serve (`serve`). Which
processes run what, and gathering their figures, is bwopt.launch's.
"""

import json
import os
import socket
import time
from typing import Dict

# Set by the local launcher in each task's environment: "<type>:<index>".
TASK_ENV = "BWOPT_CLUSTER_TASK"
# What SlurmClusterResolver reads (srun sets them for each task of a job step).
SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}'


class ClusterError(RuntimeError):
    """A task of the cluster failed, or the cluster cannot be set up."""


class PeerLost(ClusterError):
    """This task's collective ops failed because another task of the cluster went away."""


class ClusterUnavailable(ClusterError):
    """A task of the cluster did not start within cluster.startup_timeout_s: nothing was measured."""


class ClusterEnvironmentError(ValueError):
    """TF_CONFIG or SLURM's variables do not describe a cluster this task belongs to (exit code 2)."""


def check_environment(cluster_config, strategy_config) -> None:
    """The cluster's environment variables say what TensorFlow needs, read without TensorFlow.

    Raises:
        ClusterEnvironmentError: naming the variable and what is wrong with it.
    """
    if cluster_config.name == "slurm":
        check_slurm(strategy_config)
    elif cluster_config.name in ("tf_config", "local"):
        check_tf_config(cluster_config.name)


def check_tf_config(cluster_name: str) -> dict:
    """TF_CONFIG, parsed: JSON with a cluster of jobs and this task's type and index in it."""
    text = os.environ.get("TF_CONFIG", "")
    if not text.strip():
        raise ClusterEnvironmentError(
            f"cluster={cluster_name} needs the TF_CONFIG environment variable, e.g. {TF_CONFIG_EXAMPLE}"
        )
    try:
        settings = json.loads(text)
    except ValueError as error:
        raise ClusterEnvironmentError(f"TF_CONFIG is not JSON ({error}); set it to e.g. {TF_CONFIG_EXAMPLE}") from None
    cluster = settings.get("cluster") if isinstance(settings, dict) else None
    if not isinstance(cluster, dict) or not cluster or not all(isinstance(v, list) for v in cluster.values()):
        raise ClusterEnvironmentError(
            f'TF_CONFIG has no "cluster" of jobs, each a list of host:port addresses; e.g. {TF_CONFIG_EXAMPLE}'
        )
    task = settings.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ClusterEnvironmentError(
            f'TF_CONFIG has no "task" with this process\'s "type" and "index"; e.g. {TF_CONFIG_EXAMPLE}'
        )
    kind, index = task["type"], task.get("index", 0)
    if kind not in cluster:
        raise ClusterEnvironmentError(
            f"TF_CONFIG: task type {kind!r} is not a job of its cluster ({', '.join(sorted(cluster))}); "
            "set task.type to one of them"
        )
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[kind]):
        raise ClusterEnvironmentError(
            f"TF_CONFIG: task index {index!r} is beyond the cluster's {len(cluster[kind])} {kind} task(s); "
            f"set task.index to 0..{len(cluster[kind]) - 1}"
        )
    return settings


def check_slurm(strategy_config) -> None:
    missing = [name for name in SLURM_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ClusterEnvironmentError(
            f"cluster=slurm needs SLURM's variables, and {', '.join(missing)} is not set; run bwopt with srun "
            "inside an sbatch or salloc allocation, or choose another cluster"
        )
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        if not os.environ[name].isdigit():
            raise ClusterEnvironmentError(
                f"{name}={os.environ[name]!r} is not a task count or rank; run bwopt with srun"
            )
    rank, num_tasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_STEP_NUM_TASKS"])
    if rank >= num_tasks:
        raise ClusterEnvironmentError(
            f"SLURM_PROCID={rank} is beyond SLURM_STEP_NUM_TASKS={num_tasks}; run bwopt with srun"
        )
    num_ps = strategy_config.num_ps if strategy_config.name == "parameter_server" else 0
    if strategy_config.name == "parameter_server" and num_tasks < 2 + num_ps:
        raise ClusterEnvironmentError(
            f"SLURM_STEP_NUM_TASKS={num_tasks}: strategy=parameter_server with strategy.num_ps={num_ps} "
            f"needs a chief, {num_ps} ps and at least one worker task; srun -n {2 + num_ps} or more"
        )


def resolve(cluster_config, strategy_config):
    """The tf.distribute cluster resolver of this task; None for cluster=none.

    Raises:
        ClusterEnvironmentError: TF_CONFIG or SLURM's variables missing or wrong.
        ClusterError: a cluster that lacks the tasks the strategy needs.
    """
    import tensorflow as tf

    if cluster_config.name == "none":
        return None
    if cluster_config.name == "slurm":
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=slurm_jobs(strategy_config, int(os.environ["SLURM_STEP_NUM_TASKS"])),
            port_base=cluster_config.port_base,
            gpus_per_node=cluster_config.gpus_per_node,
            gpus_per_task=cluster_config.gpus_per_task,
        )
    else:
        check_tf_config(cluster_config.name)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    check_tasks(resolver.cluster_spec().as_dict(), strategy_config)
    return resolver


def slurm_jobs(strategy_config, num_tasks: int) -> Dict[str, int]:
    """How the srun tasks of an allocation become TensorFlow tasks (the first ones first)."""
    if strategy_config.name == "parameter_server":
        return {"chief": 1, "ps": strategy_config.num_ps, "worker": num_tasks - 1 - strategy_config.num_ps}
    return {"worker": num_tasks}


def check_tasks(cluster_spec: Dict[str, list], strategy_config) -> None:
    """The cluster has the tasks the strategy needs.

    Raises:
        ClusterEnvironmentError: naming what the cluster lacks.
    """
    if not cluster_spec.get("worker"):
        raise ClusterEnvironmentError(f"the cluster has no worker task: {cluster_spec}; TF_CONFIG needs a worker job")
    if strategy_config.name == "parameter_server":
        if len(cluster_spec.get("ps", [])) != strategy_config.num_ps or len(cluster_spec.get("chief", [])) != 1:
            raise ClusterEnvironmentError(
                f"strategy=parameter_server with strategy.num_ps={strategy_config.num_ps} needs one chief "
                f"and {strategy_config.num_ps} ps task(s); the cluster has {cluster_spec}"
            )


def task_name(resolver) -> str:
    return f"{resolver.task_type}:{resolver.task_id}"


def describe(resolver) -> str:
    """Every task of the cluster and its address: the processes that took part."""
    tasks = resolver.cluster_spec().as_dict()
    return ", ".join(f"{job}:{index}@{address}" for job in sorted(tasks) for index, address in enumerate(tasks[job]))


def serve(resolver) -> None:
    """A parameter-server cluster's worker or ps task: start TensorFlow's server, serve until stopped."""
    import tensorflow as tf

    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"bwopt: {task_name(resolver)} serving at {server.target}", flush=True)
    server.join()


def is_chief_task(config) -> bool:
    """Whether this process is the chief, from SLURM's task id or TF_CONFIG (before TensorFlow starts):
    the chief, or worker 0 of a cluster without one (TensorFlow's convention)."""
    if config.cluster.name == "slurm":
        return os.environ.get("SLURM_PROCID", "0") == "0"
    settings = check_tf_config(config.cluster.name)
    task, cluster = settings.get("task", {}), settings.get("cluster", {})
    if cluster.get("chief"):
        return task.get("type") == "chief"
    return task.get("type", "worker") == "worker" and int(task.get("index", 0)) == 0


def server_task(config):
    """The resolver of this process when it only serves (a parameter-server cluster's worker or ps), else None."""
    if config.strategy.name != "parameter_server":
        return None
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if config.cluster.name == "slurm":
        resolver = resolve(config.cluster, config.strategy)
    return resolver if resolver.task_type in ("worker", "ps") else None


PROBE_INTERVAL_S = 0.2


def wait_for_peers(resolver, strategy_name: str, timeout_s: float) -> None:
    """Wait until the tasks this one will talk to listen on their ports, listening on its own meanwhile.

    multi_worker_mirrored: every other chief and worker task; parameter_server: the chief's workers
    and ps tasks. The first signal stops the wait (bwopt.signals raises KeyboardInterrupt).

    Raises:
        ClusterUnavailable: a task did not listen within `timeout_s` (named, with its address),
            or this task's own port is taken.
    """
    tasks = resolver.cluster_spec().as_dict()
    own = (resolver.task_type, resolver.task_id)
    jobs = ("worker", "ps") if strategy_name == "parameter_server" else ("chief", "worker")
    pending = {f"{job}:{index}": tasks[job][index] for job in jobs for index in range(len(tasks.get(job, [])))}
    pending.pop(f"{own[0]}:{own[1]}", None)
    listener = _listen(tasks[own[0]][own[1]], f"{own[0]}:{own[1]}")
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            pending = {name: address for name, address in pending.items() if not _answers(address)}
            if pending and time.monotonic() > deadline:
                missing = ", ".join(f"{name} at {address}" for name, address in pending.items())
                raise ClusterUnavailable(
                    f"cluster task {missing} did not start within {timeout_s:g} s (cluster.startup_timeout_s); "
                    "start it with the same command, check TF_CONFIG, or raise cluster.startup_timeout_s"
                )
            if pending:
                time.sleep(PROBE_INTERVAL_S)
    finally:
        listener.close()  # TensorFlow's server binds the port next


def _listen(address: str, name: str) -> socket.socket:
    """A listening socket on this task's port (never accepting: a peer's connect completes in the backlog)."""
    port = int(address.rpartition(":")[2])
    listener = socket.socket(socket.AF_INET6 if address.startswith("[") else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as error:
        listener.close()
        raise ClusterUnavailable(
            f"this task ({name}) cannot listen on its port {port} ({error.strerror}); free the port or fix TF_CONFIG"
        ) from None
    listener.listen(64)
    return listener


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False
