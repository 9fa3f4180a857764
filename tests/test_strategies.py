"""Strategy and device knobs reach TensorFlow."""

import pytest

from bwopt.schema import StrategyConfig
from bwopt.strategies import build_strategy

TINY = ["train.epochs=1", "train.warmup_steps=2", "tracking=none", "measure.memcpy_bandwidth=false"]


@pytest.mark.parametrize(
    "name,expected",
    [("reduction_to_one", "ReductionToOneDevice"), ("hierarchical_copy", "HierarchicalCopyAllReduce")],
)
def test_cross_device_ops_are_the_configured_all_reduce(devices, name, expected):
    strategy = build_strategy(StrategyConfig(name="mirrored", cross_device_ops=name), devices)
    assert type(strategy.extended._cross_device_ops).__name__ == expected
    assert strategy.num_replicas_in_sync == 2


def test_one_device_runs_on_the_configured_device(run_experiment):
    summary = run_experiment(*TINY, "strategy=one_device", "strategy.device=/cpu:1")
    assert [device[-5:].upper() for device in summary.devices] == ["CPU:1"]


def test_steps_per_epoch_sets_the_number_of_steps(run_experiment):
    summary = run_experiment(*TINY, "train.steps_per_epoch=7", "train.epochs=2")
    assert summary.figures.num_timed_steps == 2 * 7 - 2 * 2


def test_bfloat16_precision_is_the_keras_policy_of_the_run(run_experiment):
    import keras

    try:
        summary = run_experiment(*TINY, "device.precision=mixed_bfloat16", "model.dropout=0.1")
        assert keras.mixed_precision.global_policy().compute_dtype == "bfloat16"
        assert summary.final_metrics["val_accuracy"] > 0.3
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_xla_compiled_step_trains(run_experiment):
    summary = run_experiment(*TINY, "device.jit_compile=true", "train.epochs=2")
    assert summary.final_metrics["val_accuracy"] > 0.5


def test_tpu_target_fails_with_a_clear_message_here(run_experiment):
    from bwopt.devices import DeviceError

    with pytest.raises(DeviceError, match="device=tpu .*no TPU could be reached"):
        run_experiment(*TINY, "device=tpu", "strategy=tpu")
