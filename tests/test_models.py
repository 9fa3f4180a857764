"""Every model and optimizer of the config builds, with logits per class in float32; a keras.applications
model and the user's own (`_target_`) are checked before TensorFlow loads and when built."""

import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, compose_config, known_answer, run_bwopt

from bwopt.app import validate
from bwopt.models import build_model, build_optimizer
from bwopt.schema import ConfigError


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


def test_a_cosine_schedule_takes_the_learning_rate_from_its_value_to_zero_over_the_training_steps():
    import keras
    import numpy as np

    weight = keras.Variable(np.ones(3, np.float32))
    optimizer = build_optimizer("sgd", 0.1, "float32", decay_steps=10)
    optimizer.build([weight])
    rates = []
    for _ in range(11):
        rates.append(float(optimizer.learning_rate))
        optimizer.apply_gradients([(keras.ops.ones(3), weight)])
    assert (
        rates[0] == pytest.approx(0.1) and rates[5] == pytest.approx(0.05) and rates[10] == pytest.approx(0.0, abs=1e-7)
    )
    assert float(build_optimizer("sgd", 0.1, "float32").learning_rate) == pytest.approx(0.1)  # constant


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


@pytest.mark.slow  # trains for seconds
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


# --- model=keras_app, model=custom ----------------------------------------------------------------

FIXTURE_MODELS = Path(__file__).resolve().parent / "models_fixture" / "mymodels.py"
TINY_RUN = ["train.epochs=1", "train.warmup_steps=1", "measure.memcpy_bandwidth=false", "measure.plots=false"]
# MobileNetV2 at its smallest width on the smallest images it takes.
SMALL_APP = ["model=keras_app", "model.application=MobileNetV2", "+model.kwargs.alpha=0.35"]
IMAGES_32 = ["data=synthetic", "data.image_shape=[32,32,3]", "data.num_examples=128", "data.num_classes=4"]


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    """tests/models_fixture/mymodels.py as a user's module in a folder of their own, on sys.path."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    shutil.copy(FIXTURE_MODELS, folder / "mymodels.py")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    return folder


@pytest.mark.slow
def test_keras_app_gives_float32_logits_per_class_under_mixed_precision():
    import keras
    import numpy as np

    config = validate(compose_config(SMALL_APP))
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(config.model, (32, 32, 3), 5)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.layers[1].compute_dtype == "bfloat16"  # the application computes in bfloat16...
    logits = model(np.zeros((2, 32, 32, 3), np.float32))
    assert tuple(logits.shape) == (2, 5) and logits.dtype == "float32"  # ...and gives float32 logits
    assert not np.allclose(np.sum(logits, axis=-1), 1.0)  # no softmax: logits


def test_an_unknown_application_lists_close_names():
    config = validate(compose_config([*SMALL_APP, "model.application=MobilenetV2"]))
    with pytest.raises(ConfigError, match=r"model.application='MobilenetV2' is not a model of keras.applications; "):
        build_model(config.model, (32, 32, 3), 5)
    with pytest.raises(ConfigError, match="did you mean MobileNetV2 .*available: ConvNeXtBase, .*ResNet50, "):
        build_model(config.model, (32, 32, 3), 5)


def test_images_too_small_for_the_application_name_it_and_the_data_shape():
    config = validate(compose_config(SMALL_APP))
    with pytest.raises(ConfigError) as error:
        build_model(config.model, (8, 8, 1), 10)
    message = str(error.value)
    assert "model.application='MobileNetV2'" in message and "input shape (8, 8, 1)" in message
    assert "at least 32x32" in message  # Keras's own reason


@pytest.mark.slow
def test_keras_app_loads_a_local_weights_file(tmp_path):
    import keras
    import numpy as np

    reference = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=5, classifier_activation=None
    )
    reference.save_weights(tmp_path / "mobilenet.weights.h5")
    config = validate(compose_config([*SMALL_APP, f"model.weights={tmp_path}/mobilenet.weights.h5"]))
    model = build_model(config.model, (32, 32, 3), 5)
    inputs = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(model(inputs), reference(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_keras_app_batchnorm_momentum_reaches_every_batchnorm_layer():
    import keras

    def momenta(model):
        return {
            layer.momentum for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)
        }

    own = build_model(validate(compose_config(SMALL_APP)).model, (32, 32, 3), 5)
    assert momenta(own) == {0.999}  # MobileNetV2's, made for ImageNet
    config = validate(compose_config([*SMALL_APP, "model.batchnorm_momentum=0.9"]))
    assert momenta(build_model(config.model, (32, 32, 3), 5)) == {0.9}


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.weights=imagenet"], "model.weights='imagenet' is not a local file, and bwopt downloads no weights"),
        (["model.application=''"], "model.application=''; expected the name of a keras.applications model"),
        (["+model.kwargs.classes=3"], "model.kwargs.classes is set by bwopt from the data"),
        (["strategy=model_parallel"], "strategy=model_parallel with model=keras_app: only bwopt's own"),
        (["model.batchnorm_momentum=1.0"], "model.batchnorm_momentum=1.0 is out of range; expected null"),
    ],
)
def test_keras_app_settings_are_checked_before_tensorflow(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_config([*SMALL_APP, *overrides]))


@pytest.mark.slow  # trains a MobileNetV2 for seconds
def test_keras_app_trains(run_experiment, mlflow_client):
    summary = run_experiment(*SMALL_APP, *IMAGES_32, *TINY_RUN, "train.global_batch_size=32")
    assert summary.status == "FINISHED"
    run = mlflow_client.get_run(summary.run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.application"] == "MobileNetV2"
    assert math.isfinite(run.data.metrics["loss"]) and 0.0 <= run.data.metrics["val_accuracy"] <= 1.0


BAD_TARGETS_BEFORE_TENSORFLOW = {
    "module missing": ("no_such_module.small_cnn", "no module named 'no_such_module'"),
    "attribute missing": ("mymodels.large_cnn", "module 'mymodels'"),
    "not callable": ("mymodels.NUM_FILTERS", "'NUM_FILTERS' is a constant, not a function"),
    "not a dotted path": ("small_cnn", "expected a dotted path package.module.function"),
}


@pytest.mark.parametrize("case", sorted(BAD_TARGETS_BEFORE_TENSORFLOW))
def test_a_bad_custom_target_is_refused_by_the_schema(case, user_models):
    target, reason = BAD_TARGETS_BEFORE_TENSORFLOW[case]
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["model=custom", f"model._target_={target}"]))
    assert f"model._target_={target!r}" in str(error.value) and reason in str(error.value)


def test_custom_needs_a_target_and_takes_only_bwopt_strategies_of_whole_models(user_models):
    with pytest.raises(
        ConfigError, match="model._target_ is not set and has no default: give it, e.g. model._target_=VALUE"
    ):
        validate(compose_config(["model=custom"]))
    with pytest.raises(ConfigError, match="strategy=model_parallel with model=custom"):
        validate(compose_config(["model=custom", "model._target_=mymodels.small_cnn", "strategy=model_parallel"]))


@pytest.mark.parametrize(
    "function,reason",
    [
        ("layer_list", "returned list, not a keras.Model"),
        ("one_class_too_many", "the model's output is (None, 8), expected (batch, 7)"),
        ("without_num_classes", "cannot be called with input_shape=, num_classes= and model.kwargs"),
    ],
)
def test_what_a_custom_target_returns_is_checked_when_built(function, reason, user_models):
    config = validate(compose_config(["model=custom", f"model._target_=mymodels.{function}"]))
    with pytest.raises(ConfigError) as error:
        build_model(config.model, (8, 8, 1), 7)
    assert f"model._target_='mymodels.{function}'" in str(error.value) and reason in str(error.value)


@pytest.mark.slow
def test_a_custom_model_gets_its_kwargs_and_trains(run_experiment, mlflow_client, user_models):
    # The steps bwopt's own models take apply unchanged: replicas, XLA, several steps per call, bfloat16.
    summary = run_experiment(
        "model=custom",
        "model._target_=mymodels.small_cnn",
        "+model.kwargs.filters=4",
        *TINY_RUN,
        "train.epochs=2",
        "strategy=mirrored",
        "device.jit_compile=true",
        "train.steps_per_execution=2",
        "device.precision=mixed_bfloat16",
    )
    assert summary.status == "FINISHED" and summary.num_replicas == 2
    run = mlflow_client.get_run(summary.run_id)
    assert run.info.status == "FINISHED" and run.data.params["model._target_"] == "mymodels.small_cnn"
    assert math.isfinite(run.data.metrics["loss"]) and run.data.metrics["val_accuracy"] > 0.2  # chance: 0.1
    config = validate(compose_config(["model=custom", "model._target_=mymodels.small_cnn", "+model.kwargs.filters=4"]))
    model = build_model(config.model, (8, 8, 1), 10)
    assert model.layers[1].layers[0].filters == 4  # the user's Conv2D, given model.kwargs.filters
    assert model.count_params() == (3 * 3 * 4 + 4) + (8 * 8 * 4 * 10 + 10)


@pytest.mark.slow
def test_a_custom_model_trains_from_the_command_line_on_the_users_image_folder(tmp_path):
    """The user's module and the user's folder, neither seen before: JPEG, PNG, BMP and GIF files."""
    import numpy as np
    from PIL import Image

    shutil.copy(FIXTURE_MODELS, tmp_path / "mymodels.py")
    rng = np.random.default_rng(0)
    for label, name in enumerate(("cat", "dog")):
        (tmp_path / "images" / name).mkdir(parents=True)
        for index in range(12):
            pixels = np.clip(rng.normal(60 + 120 * label, 30, (20 + index, 24, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(
                tmp_path / "images" / name / f"{index}.{('jpg', 'png', 'bmp', 'gif')[index % 4]}"
            )
    result = run_bwopt(
        "model=custom",
        "model._target_=mymodels.small_cnn",
        "data=images",
        f"data.directory={tmp_path / 'images'}",
        "data.image_size=[16,16]",
        "train.global_batch_size=4",
        *TINY_RUN,
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stderr
    assert "throughput" in result.stdout and "val accuracy" in result.stdout
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bwopt").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["model._target_"] == "mymodels.small_cnn"
    assert run.data.params["data.name"] == "images" and run.data.metrics["throughput_examples_per_s"] > 0


@pytest.mark.timing
@pytest.mark.slow
@pytest.mark.parametrize("case", ["module missing", "attribute missing", "not callable"])
def test_a_bad_custom_target_ends_in_one_line_without_tensorflow(case, tmp_path):
    shutil.copy(FIXTURE_MODELS, tmp_path / "mymodels.py")
    target, reason = BAD_TARGETS_BEFORE_TENSORFLOW[case]
    started = time.monotonic()
    # PYTHONPROFILEIMPORTTIME makes Python list every module it imports on stderr.
    result = run_bwopt(
        "model=custom",
        f"model._target_={target}",
        cwd=tmp_path,
        timeout=60,
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "PYTHONPROFILEIMPORTTIME": "1"},
    )
    elapsed_s = time.monotonic() - started
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("bwopt: invalid config: ") and f"model._target_={target!r}" in lines[0]
    assert reason in lines[0] and "Traceback" not in result.stderr
    assert "hydra" in imported and not {"tensorflow", "keras", "mlflow"} & imported
    known_answer(elapsed_s < 3, f"refused in {elapsed_s:.1f} s, bound 3 s")  # about 1.5 s here: no TensorFlow
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.slow  # loads TensorFlow to build the model
@pytest.mark.parametrize(
    "target, reason",
    [
        ("mymodels.layer_list", "returned list, not a keras.Model"),
        ("mymodels.one_class_too_many", "output is (None, 11), expected (batch, 10)"),
    ],
)
def test_what_a_custom_target_returns_is_refused_before_the_mlflow_run(target, reason, tmp_path):
    shutil.copy(FIXTURE_MODELS, tmp_path / "mymodels.py")
    result = run_bwopt(
        "model=custom", f"model._target_={target}", cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    )
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith(f"bwopt: invalid config: model._target_={target!r}")
    assert reason in line and not (tmp_path / "outputs" / "mlflow.db").exists()
