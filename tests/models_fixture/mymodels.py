"""A user's own models, as `model=custom model._target_=mymodels.<name>` names them (tests/test_models.py
puts this folder on the import path). Only what `small_cnn` builds is right; the rest are mistakes."""

import keras

NUM_FILTERS = 8  # a constant: not callable


def small_cnn(input_shape, num_classes, filters=NUM_FILTERS):
    """The contract: keyword arguments in, a keras.Model giving (batch, num_classes) logits out."""
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes),
        ],
        name="small_cnn",
    )


def layer_list(input_shape, num_classes):
    """Returns layers, not a model."""
    return [keras.layers.Flatten(), keras.layers.Dense(num_classes)]


def one_class_too_many(input_shape, num_classes):
    """Returns a model whose output has the wrong number of logits."""
    return keras.Sequential(
        [keras.Input(shape=input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes + 1)]
    )


def without_num_classes(input_shape):
    """Takes no num_classes."""
    return small_cnn(input_shape, 10)


def fills_the_disk(input_shape, num_classes, path):
    """small_cnn, built after filling the filesystem of `path` to its last byte: the disk fills
    while the run is under way, as when another process writes to it."""
    with open(path, "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:  # ENOSPC: full
            pass
    return small_cnn(input_shape, num_classes)
