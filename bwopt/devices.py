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

    kind: str
    device_names: List[str]
    tpu_resolver: Optional[object] = None


def configure_cpu(config) -> DeviceSetup:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(config.num_cpu_devices)]
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
        tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
    except RuntimeError:
        have = {
            "num_cpu_devices": len(tf.config.list_logical_devices("CPU")),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        }
        refuse_changes(config, have)
    return DeviceSetup("cpu", [device.name for device in tf.config.list_logical_devices("CPU")])


def configure_gpu(config) -> DeviceSetup:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise DeviceError(
            "device=gpu, but TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is "
            "empty); install the CUDA build with `pip install 'bwopt[gpu]'` on a machine with an "
            "NVIDIA driver, or use device=cpu"
        )
    if config.visible_gpus is not None:
        missing = [index for index in config.visible_gpus if index >= len(gpus)]
        if missing:
            raise DeviceError(f"device.visible_gpus={config.visible_gpus}: only {len(gpus)} GPUs exist")
        gpus = [gpus[index] for index in config.visible_gpus]
    try:
        tf.config.set_visible_devices(gpus, "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, config.memory_growth)
            if config.memory_limit_mb is not None:
                limit = tf.config.LogicalDeviceConfiguration(memory_limit=config.memory_limit_mb)
                tf.config.set_logical_device_configuration(gpu, [limit])
    except RuntimeError:
        refuse_changes(config, {"memory_growth": tf.config.experimental.get_memory_growth(gpus[0])})
    return DeviceSetup("gpu", [device.name for device in tf.config.list_logical_devices("GPU")])


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
    return DeviceSetup("tpu", [device.name for device in tf.config.list_logical_devices("TPU")], resolver)


def refuse_changes(config, have: dict) -> None:
    """In a process whose devices are already initialised, accept only the same settings."""
    changed = {key: value for key, value in have.items() if getattr(config, key) != value}
    if changed:
        described = ", ".join(f"device.{key}={getattr(config, key)} (it has {value})" for key, value in changed.items())
        raise DeviceError(
            f"TensorFlow was already initialised in this process, so {described} cannot take "
            "effect; run each device set-up in its own process"
        )


TARGETS = {"cpu": configure_cpu, "gpu": configure_gpu, "tpu": configure_tpu}


def configure(config) -> DeviceSetup:
    """Set up the device target and the global precision policy."""
    import keras

    setup = TARGETS[config.name](config)
    keras.mixed_precision.set_global_policy(config.precision)
    return setup
