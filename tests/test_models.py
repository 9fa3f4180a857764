"""Every model and optimizer of the config builds, with logits per class in float32."""

import pytest
from conftest import compose_config

from bwopt.app import validate
from bwopt.models import build_model, build_optimizer


@pytest.mark.parametrize("option,input_shape", [("mlp", (8, 8, 1)), ("cnn", (8, 8, 1)), ("cnn", (32, 32, 3))])
def test_models_give_float32_logits_per_class(option, input_shape):
    import numpy as np

    config = validate(compose_config([f"model={option}"]))
    model = build_model(config.model, input_shape, 7)
    logits = model(np.zeros((2, *input_shape), np.float32))
    assert tuple(logits.shape) == (2, 7) and logits.dtype == "float32"


@pytest.mark.parametrize("name,class_name", [("adam", "Adam"), ("sgd", "SGD"), ("rmsprop", "RMSprop")])
def test_optimizers_by_name_and_loss_scaling_for_float16(name, class_name):
    assert type(build_optimizer(name, 0.01, "float32")).__name__ == class_name
    assert type(build_optimizer(name, 0.01, "mixed_float16")).__name__ == "LossScaleOptimizer"


def test_an_unknown_optimizer_lists_the_valid_names():
    with pytest.raises(ValueError, match="expected one of: adam, sgd, rmsprop"):
        build_optimizer("lion", 0.01, "float32")


def test_stages_place_their_variables_and_ops_on_their_devices(devices):
    import numpy as np

    config = validate(compose_config(["model.hidden_units=[32,16]"]))
    model = build_model(config.model, (8, 8, 1), 10, devices.device_names[:2])
    stage_of = {variable.path: stage.name for stage in model.stages for variable in stage.trainable_variables}
    placed = {variable.path: variable.value.device for variable in model.trainable_variables}
    for path, device in placed.items():
        expected = devices.device_names[int(stage_of[path][-1])]
        assert device.endswith(expected[-5:]), (path, device, expected)
    assert len({device for device in placed.values()}) == 2
    # Same layers as the one-device model: same outputs for the same weights.
    single = build_model(config.model, (8, 8, 1), 10)
    single.set_weights(model.get_weights())
    inputs = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    np.testing.assert_allclose(model(inputs), single(inputs), rtol=1e-5, atol=1e-6)


def test_a_model_parallel_run_trains_on_its_stage_devices(run_experiment):
    summary = run_experiment(
        "strategy=model_parallel",
        "model.hidden_units=[64,64]",
        "train.epochs=2",
        "train.warmup_steps=3",
        "tracking=none",
    )
    assert summary.status == "FINISHED" and summary.num_replicas == 1
    assert [device[-5:] for device in summary.devices] == ["CPU:0", "CPU:1"]
    assert summary.final_metrics["val_accuracy"] > 0.5
