"""Device targets: logical CPUs, precision, XLA, and the GPU and TPU paths failing clearly here."""

import pytest

TINY = ["train.epochs=2", "train.warmup_steps=3"]


@pytest.mark.slow  # trains for seconds
def test_bfloat16_precision_is_the_keras_policy_of_the_run(run_experiment):
    import keras

    try:
        summary = run_experiment(*TINY, "device.precision=mixed_bfloat16", "model.dropout=0.1")
        assert keras.mixed_precision.global_policy().compute_dtype == "bfloat16"
        assert summary.final_metrics["val_accuracy"] > 0.3
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow  # trains for seconds
def test_xla_compiled_step_trains(run_experiment):
    summary = run_experiment(*TINY, "device.jit_compile=true", "train.epochs=2")
    assert summary.final_metrics["val_accuracy"] > 0.5


@pytest.mark.slow  # seconds to find no TPU
def test_tpu_target_fails_with_a_clear_message_here(run_experiment):
    from bwopt.devices import DeviceError

    with pytest.raises(DeviceError, match="device=tpu .*no TPU could be reached"):
        run_experiment(*TINY, "device=tpu", "strategy=tpu")


def test_gpu_target_fails_with_a_clear_message_here(run_experiment, mlflow_client):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is present: the missing-GPU message cannot be shown")
    from bwopt.devices import DeviceError

    with pytest.raises(DeviceError, match=r"TensorFlow sees no GPU.*bwopt\[gpu\].*device=cpu"):
        run_experiment("device=gpu", *TINY, experiment="no_gpu")
    # Devices are set up before the MLflow run starts: a missing device records no FAILED run.
    assert mlflow_client.get_experiment_by_name("no_gpu") is None


@pytest.mark.slow  # trains for seconds
def test_other_cpu_count_in_an_initialised_process_is_refused(run_experiment):
    from bwopt.devices import DeviceError

    run_experiment("tracking=none", *TINY)  # make sure TensorFlow is initialised
    with pytest.raises(DeviceError, match=r"already initialised.*device.num_cpu_devices=3 \(it has 2\)"):
        run_experiment("tracking=none", "device.num_cpu_devices=3", "train.global_batch_size=63", *TINY)
    with pytest.raises(DeviceError, match=r"device.intra_op_threads=1 \(it has 0\)"):
        run_experiment("tracking=none", "device.intra_op_threads=1", *TINY)
