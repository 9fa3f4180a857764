"""Keras models: inputs arrive already cast and normalised by the train step."""

from typing import Tuple


def build_mlp(config, input_shape: Tuple[int, ...], num_classes: int):
    import keras

    layers = [keras.Input(shape=input_shape), keras.layers.Flatten()]
    for units in config.hidden_units:
        layers.append(keras.layers.Dense(units, activation="relu"))
        if config.dropout:
            layers.append(keras.layers.Dropout(config.dropout))
    # Logits in float32 even under a mixed precision policy, for a stable softmax.
    layers.append(keras.layers.Dense(num_classes, dtype="float32"))
    return keras.Sequential(layers, name="mlp")


def build_cnn(config, input_shape: Tuple[int, ...], num_classes: int):
    import keras

    layers = [keras.Input(shape=input_shape)]
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
    return keras.Sequential(layers, name="cnn")


# Keyed by the options of conf/model/ (bwopt.schema.SCHEMAS["model"]).
MODELS = {"mlp": build_mlp, "cnn": build_cnn}


def build_model(config, input_shape: Tuple[int, ...], num_classes: int):
    try:
        builder = MODELS[config.name]
    except KeyError:
        raise ValueError(f"unknown model {config.name!r}; expected one of: {', '.join(MODELS)}") from None
    return builder(config, input_shape, num_classes)


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
