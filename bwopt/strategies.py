"""tf.distribute strategies, built from the strategy config and the configured devices."""

from bwopt.devices import DeviceSetup


def build_default(config, devices: DeviceSetup):
    import tensorflow as tf

    return tf.distribute.get_strategy()


def build_one_device(config, devices: DeviceSetup):
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy(config.device or devices.device_names[0])


def build_mirrored(config, devices: DeviceSetup):
    import tensorflow as tf

    # Keyed by bwopt.schema.CROSS_DEVICE_OPS.
    cross_device_ops = {
        "auto": lambda: None,
        "reduction_to_one": tf.distribute.ReductionToOneDevice,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "nccl": tf.distribute.NcclAllReduce,
    }[config.cross_device_ops]()
    return tf.distribute.MirroredStrategy(devices=devices.device_names, cross_device_ops=cross_device_ops)


def build_tpu(config, devices: DeviceSetup):
    import tensorflow as tf

    return tf.distribute.TPUStrategy(devices.tpu_resolver)


# Keyed by the options of conf/strategy/ (bwopt.schema.SCHEMAS["strategy"]).
STRATEGIES = {
    "default": build_default,
    "one_device": build_one_device,
    "mirrored": build_mirrored,
    "tpu": build_tpu,
}


def build_strategy(config, devices: DeviceSetup):
    try:
        builder = STRATEGIES[config.name]
    except KeyError:
        raise ValueError(f"unknown strategy {config.name!r}; expected one of: {', '.join(STRATEGIES)}") from None
    return builder(config, devices)


def replica_devices(strategy, devices: DeviceSetup):
    """The devices the replicas run on (the default strategy uses the first device)."""
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
