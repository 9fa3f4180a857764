"""Keras models: inputs arrive already cast and normalised by the train step.

Each builder gives the model's layers in order; `build_model` makes them one `keras.Sequential`,
or, with stage devices (strategy=model_parallel), consecutive groups of them placed each on its
own device: a simple pipeline of stages (model parallelism).
"""

from typing import Sequence, Tuple


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


# Keyed by the options of conf/model/ (bwopt.schema.SCHEMAS["model"]).
MODELS = {"mlp": build_mlp, "cnn": build_cnn}


def build_model(config, input_shape: Tuple[int, ...], num_classes: int, stage_devices: Sequence[str] = ()):
    """The model of `config`; with two or more `stage_devices`, its layers split into as many
    consecutive stages of about equal size, stage i's variables and ops on stage_devices[i]."""
    import keras

    try:
        builder = MODELS[config.name]
    except KeyError:
        raise ValueError(f"unknown model {config.name!r}; expected one of: {', '.join(MODELS)}") from None
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


def build_optimizer(name: str, learning_rate: float, precision: str):
    """The optimizer; float16 training gets dynamic loss scaling against underflow."""
    import keras

    try:
        optimizer_class = getattr(keras.optimizers, OPTIMIZERS[name])
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; expected one of: {', '.join(OPTIMIZERS)}") from None
    optimizer = optimizer_class(learning_rate=learning_rate)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
