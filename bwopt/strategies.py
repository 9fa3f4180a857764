"""tf.distribute strategies, built from the strategy config and the configured devices.

Single-host strategies (default, one_device, mirrored, tpu) are built after `bwopt.devices.configure`.
The multi-process ones (multi_worker_mirrored, parameter_server) take the cluster's resolver
(bwopt.cluster.resolve) and must exist before TensorFlow initialises its devices: TensorFlow
configures collective ops at program start-up. `set_up_strategy` does both in the right order.
"""

from typing import Optional

from bwopt.devices import DeviceSetup


def build_default(config, devices: DeviceSetup):
    import tensorflow as tf

    return tf.distribute.get_strategy()


def build_one_device(config, devices: DeviceSetup):
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy(config.device or devices.device_names[0])


# One MirroredStrategy per device set and all-reduce in a process: a new strategy restarts the
# collective ops' instance keys, so a second one whose graph differs (another model) collides with
# the first in TensorFlow's collective executor ("Shape mismatch in the collective instance 100").
# Runs of one process (tests, notebooks) share it; its variables are made anew in its scope per run.
_MIRRORED: dict = {}


def build_mirrored(config, devices: DeviceSetup):
    import tensorflow as tf

    key = (tuple(devices.device_names), config.cross_device_ops)
    if key not in _MIRRORED:
        # Keyed by bwopt.schema.CROSS_DEVICE_OPS.
        cross_device_ops = {
            "auto": lambda: None,
            "reduction_to_one": tf.distribute.ReductionToOneDevice,
            "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
            "nccl": tf.distribute.NcclAllReduce,
        }[config.cross_device_ops]()
        _MIRRORED[key] = tf.distribute.MirroredStrategy(devices=devices.device_names, cross_device_ops=cross_device_ops)
    return _MIRRORED[key]


def build_tpu(config, devices: DeviceSetup):
    import tensorflow as tf

    return tf.distribute.TPUStrategy(devices.tpu_resolver)


def build_multi_worker_mirrored(config, devices, resolver=None):
    import tensorflow as tf

    # Keyed by bwopt.schema.COMMUNICATIONS.
    implementation = {"auto": "AUTO", "ring": "RING", "nccl": "NCCL"}[config.communication]
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=config.bytes_per_pack,
        timeout_seconds=config.timeout_s,
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation),
    )
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


def build_parameter_server(config, devices, resolver=None):
    import tensorflow as tf

    partitioner = None
    if config.max_shards > 1:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=config.min_shard_bytes, max_shards=config.max_shards
        )
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


# Keyed by the options of conf/strategy/ (bwopt.schema.SCHEMAS["strategy"]).
def build_model_parallel(config, devices: DeviceSetup):
    import tensorflow as tf

    if len(devices.device_names) < config.num_stages:
        raise ValueError(
            f"strategy.num_stages={config.num_stages}, but only {len(devices.device_names)} devices: "
            f"{', '.join(devices.device_names)}"
        )
    return tf.distribute.get_strategy()  # one replica: the stages place the layers (bwopt.models)


def stage_devices(config, devices: DeviceSetup) -> list:
    """The devices of the model's stages under strategy=model_parallel ([] for any other strategy)."""
    return list(devices.device_names[: config.num_stages]) if config.name == "model_parallel" else []


STRATEGIES = {
    "default": build_default,
    "one_device": build_one_device,
    "mirrored": build_mirrored,
    "model_parallel": build_model_parallel,
    "tpu": build_tpu,
    "multi_worker_mirrored": build_multi_worker_mirrored,
    "parameter_server": build_parameter_server,
}
# Built from the cluster's resolver, before the devices are read back.
MULTI_PROCESS = ("multi_worker_mirrored", "parameter_server")
# Strategies whose steps must stay `tf.function`s (bwopt.train.DirectCall is off): a coordinator
# schedules parameter_server's, and a TPU's run only as TensorFlow compiles them for it.
TF_FUNCTION_STEPS = ("parameter_server", "tpu")


def build_strategy(config, devices: Optional[DeviceSetup], resolver=None):
    try:
        builder = STRATEGIES[config.name]
    except KeyError:
        raise ValueError(f"unknown strategy {config.name!r}; expected one of: {', '.join(STRATEGIES)}") from None
    if config.name in MULTI_PROCESS:
        return builder(config, devices, resolver)
    return builder(config, devices)


def set_up_strategy(strategy_config, device_config, resolver=None, startup_timeout_s: float = 120.0):
    """(DeviceSetup, strategy): the devices, then the strategy; for a multi-process strategy the
    device settings, the wait for the other tasks (bounded by `startup_timeout_s`, stopped by a
    signal: bwopt.cluster.wait_for_peers), then the strategy (which starts this task's server and
    joins the cluster), then this task's devices read back.

    TensorFlow's multi-worker runtime installs a SIGTERM handler of its own (its preemption
    notifier), which would swallow SIGTERM for the rest of the run; bwopt's is put back.
    """
    from bwopt.devices import configure

    if strategy_config.name not in MULTI_PROCESS:
        devices = configure(device_config)
        return devices, build_strategy(strategy_config, devices)
    import keras
    import tensorflow as tf

    from bwopt.cluster import wait_for_peers
    from bwopt.signals import STOP

    apply_device_settings(device_config)
    if resolver is not None and resolver.cluster_spec().as_dict():
        wait_for_peers(resolver, strategy_config.name, startup_timeout_s)
    strategy = build_strategy(strategy_config, None, resolver)
    STOP.reclaim()
    keras.mixed_precision.set_global_policy(device_config.precision)
    # After joining, TensorFlow lists every task's devices; this task's are the ones it runs on.
    local = f"/job:{resolver.task_type}/replica:0/task:{resolver.task_id}/"
    kind = "GPU" if device_config.name == "gpu" else "CPU"
    names = [device.name for device in tf.config.list_logical_devices(kind) if device.name.startswith(local)]
    return DeviceSetup(names), strategy


def apply_device_settings(config) -> None:
    """The device settings of bwopt.devices, applied before TensorFlow initialises (nothing is read back:
    after a multi-process strategy starts, TensorFlow lists the other tasks' devices too)."""
    import tensorflow as tf

    if config.name == "cpu":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(config.num_cpu_devices)]
        )
        tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
    elif config.name == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if config.visible_gpus is not None:
            gpus = [gpus[index] for index in config.visible_gpus]
        tf.config.set_visible_devices(gpus, "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, config.memory_growth)


def replica_devices(strategy, devices: DeviceSetup):
    """The devices the replicas run on (the default strategy uses the first device).

    multi_worker_mirrored: every worker's (this task's replicas, repeated on each worker task);
    parameter_server: each worker's first device, where the coordinator runs its steps.
    """
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        resolver = strategy.cluster_resolver
        local = [tf.DeviceSpec.from_string(name) for name in strategy.extended.worker_devices]
        num_workers = len(resolver.cluster_spec().as_dict().get("worker", []))
        return [spec.replace(task=task).to_string() for task in range(num_workers) for spec in local]
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        num_workers = strategy.extended._num_workers  # its cluster_resolver property is None in TF 2.21
        return [f"/job:worker/replica:0/task:{task}/device:CPU:0" for task in range(num_workers)]
    try:
        return list(strategy.extended.worker_devices)
    except RuntimeError:
        return devices.device_names[:1]


def distribute_input(strategy, config, make_dataset):
    """Distribute the training or validation input as pipeline.distribute says.

    Args:
        strategy: the tf.distribute strategy.
        config: pipeline.distribute.
        make_dataset: input context (None with experimental_distribute_dataset, which then
            splits global batches) -> tf.data.Dataset.
    """
    import tensorflow as tf

    options = tf.distribute.InputOptions(
        experimental_fetch_to_device=config.fetch_to_device,
        experimental_per_replica_buffer_size=config.per_replica_buffer_size,
    )
    if config.method == "distribute_datasets_from_function":
        return strategy.distribute_datasets_from_function(make_dataset, options=options)
    return strategy.experimental_distribute_dataset(make_dataset(None), options=options)


def place_on_replica_devices(strategy, batch, device_names):
    """A copy of a distributed batch with each replica's part on that replica's device.

    With `fetch_to_device=false`, or the default strategy on a GPU, batches arrive in host
    memory and every step would copy them; the compute ceiling must not time that copy.
    """
    import tensorflow as tf

    parts = [strategy.experimental_local_results(value) for value in tf.nest.flatten(batch)]
    placed = []
    for replica, device in enumerate(device_names):
        with tf.device(device):
            placed.append(tf.nest.pack_sequence_as(batch, [tf.identity(part[replica]) for part in parts]))
    if strategy.num_replicas_in_sync == 1:
        return placed[0]
    return strategy.experimental_distribute_values_from_function(
        lambda context: placed[context.replica_id_in_sync_group]
    )
