"""Keras models: inputs arrive already cast and normalised by the train step.

bwopt's own builders (mlp, cnn) give the model's layers in order; `build_model` makes them one
`keras.Sequential`, or, with stage devices (strategy=model_parallel), consecutive groups of them
placed each on its own device: a simple pipeline of stages (model parallelism). The keras_app and
custom builders give a whole `keras.Model` (an application of `keras.applications`, or the one the
user's `model._target_` returns), checked to give (batch, num_classes) logits, cast to float32.
"""

import difflib
from typing import Optional, Sequence, Tuple

from bwopt.schema.checks import ConfigError
from bwopt.schema.models import STAGED_MODELS
from bwopt.schema.targets import resolve_target


def build_mlp(config, input_shape: Tuple[int, ...], num_classes: int):
    import keras

    layers = [keras.layers.Flatten()]
    for units in config.hidden_units:
        layers.append(keras.layers.Dense(units, activation="relu"))
        if config.dropout:
            layers.append(keras.layers.Dropout(config.dropout))
    # Logits in float32 even under a mixed precision policy, for a stable softmax.
    layers.append(keras.layers.Dense(num_classes, dtype="float32"))
    return layers


def build_cnn(config, input_shape: Tuple[int, ...], num_classes: int):
    import keras

    layers = []
    spatial_size = min(input_shape[:2])
    for filters in config.filters:
        layers.append(keras.layers.Conv2D(filters, config.kernel_size, padding="same", activation="relu"))
        if spatial_size >= 4:  # pool while the feature map is big enough to halve
            layers.append(keras.layers.MaxPooling2D(2))
            spatial_size //= 2
    layers += [
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(config.dense_units, activation="relu"),
        keras.layers.Dense(num_classes, dtype="float32"),
    ]
    return layers


def build_keras_app(config, input_shape: Tuple[int, ...], num_classes: int):
    """`keras.applications.<model.application>` with random or local weights, a head for
    `num_classes` classes and no softmax."""
    constructor = keras_application(config.application)
    try:
        application = constructor(
            include_top=True,
            weights=config.weights,
            input_shape=tuple(input_shape),
            classes=num_classes,
            classifier_activation=None,  # logits: bwopt's loss takes from_logits=True
            **config.kwargs,
        )
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"model.application={config.application!r} cannot be built for the data's input shape "
            f"{tuple(input_shape)} and {num_classes} classes (model.kwargs={config.kwargs!r}, "
            f"model.weights={config.weights!r}): {error}; use data of a shape it accepts "
            "(e.g. data=synthetic data.image_shape=[32,32,3]) or other model.kwargs"
        ) from None
    if config.batchnorm_momentum is not None:
        set_batchnorm_momentum(application, config.batchnorm_momentum)
    return float32_logits(application, input_shape, num_classes, f"model.application={config.application!r}")


def set_batchnorm_momentum(model, momentum: float) -> None:
    """Every BatchNormalization layer of `model` (of nested models too) with `momentum`.

    The applications keep ImageNet's 0.99 or 0.999: over the few hundred steps of a small data
    set, moving statistics that slow still hold their initial values (mean 0, variance 1), and
    the model evaluated with them predicts the same for every image whatever it learned.
    """
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = momentum
        elif hasattr(layer, "layers"):  # a nested model
            set_batchnorm_momentum(layer, momentum)


def keras_application(name: str):
    """The constructor of `keras.applications` named `name`.

    Raises:
        ConfigError: naming model.application, the closest names and every available one.
    """
    import keras

    available = sorted(attribute for attribute in dir(keras.applications) if attribute[:1].isupper())
    if name in available:
        return getattr(keras.applications, name)
    by_lower_case = {attribute.lower(): attribute for attribute in available}
    close = [by_lower_case[match] for match in difflib.get_close_matches(name.lower(), by_lower_case, n=3)]
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(
        f"model.application={name!r} is not a model of keras.applications; {hint}available: {', '.join(available)}"
    )


def build_custom(config, input_shape: Tuple[int, ...], num_classes: int):
    """The user's model: `model._target_(input_shape=, num_classes=, **model.kwargs)`."""
    import inspect

    import keras

    key = f"model._target_={config._target_!r}"
    function = resolve_target("model._target_", config._target_)
    arguments = {"input_shape": tuple(input_shape), "num_classes": num_classes, **config.kwargs}
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as error:
        raise ConfigError(
            f"{key} cannot be called with input_shape=, num_classes= and model.kwargs "
            f"{sorted(config.kwargs)}: {error}; give it those keyword parameters"
        ) from None
    except ValueError:  # a builtin without a signature: calling it will tell
        pass
    model = function(**arguments)
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"{key} returned {type(model).__name__}, not a keras.Model; "
            "return e.g. keras.Sequential([...]) or keras.Model(inputs, outputs)"
        )
    return float32_logits(model, input_shape, num_classes, key)


def float32_logits(model, input_shape: Tuple[int, ...], num_classes: int, key: str):
    """`model` with a float32 output, after checking that it takes the data's inputs and gives
    (batch, num_classes) logits.

    Raises:
        ConfigError: naming `key` (the config entry the model comes from), the shapes and the fix.
    """
    import keras

    inputs = keras.Input(shape=tuple(input_shape))
    try:
        outputs = model(inputs)  # symbolic: shapes only, no computation
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{key}: the model does not take the data's inputs {inputs.shape}: {error}") from None
    shape = tuple(getattr(outputs, "shape", ()))
    if len(shape) != 2 or shape[1] != num_classes:
        raise ConfigError(
            f"{key}: the model's output is {shape or type(outputs).__name__}, expected (batch, {num_classes}): "
            f"one logit per class of the data; end it with keras.layers.Dense(num_classes)"
        )
    # Logits in float32 even under a mixed precision policy, for a stable softmax (as bwopt's own models).
    logits = keras.layers.Activation("linear", dtype="float32", name="float32_logits")(outputs)
    return keras.Model(inputs, logits, name=model.name)


# Keyed by the options of conf/model/ (bwopt.schema.SCHEMAS["model"]): those of STAGED_MODELS give
# their layers, the others a whole keras.Model.
MODELS = {"mlp": build_mlp, "cnn": build_cnn, "keras_app": build_keras_app, "custom": build_custom}


def build_model(config, input_shape: Tuple[int, ...], num_classes: int, stage_devices: Sequence[str] = ()):
    """The model of `config`; with two or more `stage_devices`, its layers split into as many
    consecutive stages of about equal size, stage i's variables and ops on stage_devices[i].

    Raises:
        ConfigError: a keras_app or custom model that cannot be built, or stages asked of one.
    """
    import keras

    try:
        builder = MODELS[config.name]
    except KeyError:
        raise ValueError(f"unknown model {config.name!r}; expected one of: {', '.join(MODELS)}") from None
    if config.name not in STAGED_MODELS:
        if len(stage_devices) >= 2:  # the schema refuses this combination; a direct call may not
            raise ConfigError(f"model={config.name} is one keras.Model and cannot be split into stages")
        return builder(config, input_shape, num_classes)
    layers = builder(config, input_shape, num_classes)
    if len(stage_devices) < 2:
        return keras.Sequential([keras.Input(shape=input_shape), *layers], name=config.name)
    return staged_model(layers, input_shape, stage_devices, name=f"{config.name}_stages")


def staged_model(layers: list, input_shape: Tuple[int, ...], stage_devices: Sequence[str], name: str):
    """Consecutive groups of `layers`, group i built and run on `stage_devices[i]`.

    The activations of one stage are copied to the next stage's device: that transfer is what model
    parallelism costs against data parallelism, in exchange for no replica holding the whole model.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    if len(layers) < len(stage_devices):
        raise ValueError(f"{len(layers)} layers cannot fill {len(stage_devices)} stages; use fewer stages")
    groups = [list(group) for group in np.array_split(np.array(layers, dtype=object), len(stage_devices))]

    class PipelineStages(keras.Model):
        def __init__(self) -> None:
            super().__init__(name=name)
            self.stages = [keras.Sequential(group, name=f"stage{index}") for index, group in enumerate(groups)]
            self.stage_devices = list(stage_devices)
            shape = (None, *input_shape)
            for stage, device in zip(self.stages, self.stage_devices):
                with tf.device(device):  # the stage's variables live on its device
                    stage.build(shape)
                shape = stage.compute_output_shape(shape)

        def call(self, inputs, training=None):
            outputs = inputs
            for stage, device in zip(self.stages, self.stage_devices):
                with tf.device(device):
                    outputs = stage(outputs, training=training)
            return outputs

    model = PipelineStages()
    model.build((None, *input_shape))
    return model


# Keyed by bwopt.schema.OPTIMIZERS: the Keras optimizer class of each, by name.
OPTIMIZERS = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop"}


def build_optimizer(name: str, learning_rate: float, precision: str, decay_steps: Optional[int] = None):
    """The optimizer; float16 training gets dynamic loss scaling against underflow. `decay_steps`:
    the learning rate follows a cosine from `learning_rate` to 0 over that many training steps
    (`train.lr_schedule=cosine`; Keras's CosineDecay, driven by the optimizer's own step count,
    so a resumed run continues it)."""
    import keras

    try:
        optimizer_class = getattr(keras.optimizers, OPTIMIZERS[name])
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; expected one of: {', '.join(OPTIMIZERS)}") from None
    if decay_steps:
        learning_rate = keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps)
    optimizer = optimizer_class(learning_rate=learning_rate)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
