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
