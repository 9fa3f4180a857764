"""Device targets: logical CPUs, GPUs (memory growth, memory cap) and TPUs, plus precision.

TensorFlow fixes its devices when it first initialises them, so `configure` must run before
any tensor is created. In a process that is already initialised (a multirun job, a test
session) it accepts an identical set-up and rejects a different one with a clear message.
"""

from dataclasses import dataclass
from typing import List, Optional


class DeviceError(RuntimeError):
    """The requested device target is not available on this machine."""


@dataclass
class DeviceSetup:
    """What `configure` produced: the logical devices replicas may use, by name."""

    device_names: List[str]
    tpu_resolver: Optional[object] = None


def configure_cpu(config) -> DeviceSetup:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(config.num_cpu_devices)]
        )
        tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
    except RuntimeError:
        pass  # already initialised: the read-back below says whether the settings match
    wanted = {
        "num_cpu_devices": config.num_cpu_devices,
        "intra_op_threads": config.intra_op_threads,
        "inter_op_threads": config.inter_op_threads,
    }
    have = {
        "num_cpu_devices": len(tf.config.list_logical_devices("CPU")),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    }
    refuse_changes(wanted, have)
    return DeviceSetup([device.name for device in tf.config.list_logical_devices("CPU")])


def configure_gpu(config) -> DeviceSetup:
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    if not physical:
        raise DeviceError(
            "device=gpu, but TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is "
            "empty); install the CUDA build with `pip install 'bwopt[gpu]'` on a machine with an "
            "NVIDIA driver, or use device=cpu"
        )
    indices = list(range(len(physical))) if config.visible_gpus is None else list(config.visible_gpus)
    if max(indices) >= len(physical):
        raise DeviceError(f"device.visible_gpus={config.visible_gpus}: only {len(physical)} GPUs exist")
    gpus = [physical[index] for index in indices]
    limits = None if config.memory_limit_mb is None else [config.memory_limit_mb]
    try:
        tf.config.set_visible_devices(gpus, "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, config.memory_growth)
            if limits:
                tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(limits[0])])
    except RuntimeError:
        pass  # already initialised: the read-back below says whether the settings match
    visible = tf.config.get_visible_devices("GPU")
    logical = tf.config.get_logical_device_configuration(gpus[0])
    refuse_changes(
        {"visible_gpus": indices, "memory_growth": config.memory_growth, "memory_limit_mb": limits},
        {
            "visible_gpus": [physical.index(gpu) for gpu in visible],
            "memory_growth": tf.config.experimental.get_memory_growth(gpus[0]),
            "memory_limit_mb": [device.memory_limit for device in logical] if logical else None,
        },
    )
    return DeviceSetup([device.name for device in tf.config.list_logical_devices("GPU")])


def configure_tpu(config) -> DeviceSetup:
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise DeviceError(
            f"device=tpu with device.tpu={config.tpu!r}: no TPU could be reached ({error}); "
            "run on a Cloud TPU VM or give its name or grpc:// address"
        ) from None
    return DeviceSetup([device.name for device in tf.config.list_logical_devices("TPU")], resolver)


def refuse_changes(wanted: dict, have: dict) -> None:
    """Compare the device settings read back from TensorFlow with the requested ones.

    TensorFlow fixes devices when it first initialises them; later calls raise or, for an
    unchanged call, do nothing. Reading the settings back catches both.
    """
    changed = [key for key in wanted if wanted[key] != have[key]]
    if changed:
        described = ", ".join(f"device.{key}={wanted[key]} (it has {have[key]})" for key in changed)
        raise DeviceError(
            f"TensorFlow was already initialised in this process, so {described} cannot take "
            "effect; run each device set-up in its own process"
        )


# Keyed by the options of conf/device/ (bwopt.schema.SCHEMAS["device"]).
TARGETS = {"cpu": configure_cpu, "gpu": configure_gpu, "tpu": configure_tpu}


def configure(config) -> DeviceSetup:
    """Set up the device target and the global precision policy."""
    import keras

    setup = TARGETS[config.name](config)
    keras.mixed_precision.set_global_policy(config.precision)
    return setup
