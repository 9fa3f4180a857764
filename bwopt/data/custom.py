"""data=custom: the user's own tf.data function, named by `data._target_`.

The function (called once, with `data.kwargs` as keyword arguments) returns a
`tf.data.Dataset` of unbatched `(features, integer label)` examples, or a `(train, validation)`
pair of them. bwopt adds what conf/pipeline/ controls around it (cast, cache, shuffle, repeat,
augmentation, batch, service, prefetch, options, distribution); what happens inside the
user's dataset is the user's (README, "Your own data").

Sizes must be known before the run is planned, so the examples are counted once, here: one
pass over the labels (the user's pipeline runs for it). A single dataset is split by a seeded
hash of each example's index: example i is held out when a stateless uniform draw seeded with
(seed, i) falls below `split.validation_fraction`, the same examples every run and epoch, in
any order of arrival. Stratifying would need every label before the split, so it is refused
(bwopt.schema.data.check_data_combination).
"""

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from bwopt.data.records import DataError
from bwopt.schema.targets import resolve_target

KEY = "data._target_"
PARTS = ("train", "validation")
COUNT_BATCH = 4096  # examples per reduction step while counting: Python's per-element cost stays out


@dataclass
class DatasetSource:
    """The user's datasets, split, with the sizes counted once.

    Attributes:
        train, validation: tf.data.Datasets of (features, int32 label).
    """

    train: Any
    validation: Any
    feature_shape: Tuple[int, ...]
    feature_dtype: str
    num_classes: int
    feature_scale: float
    num_train_examples: int
    num_validation_examples: int
    step_compute_s: float = 0.0
    value_range: Optional[Tuple[float, float]] = None
    encoded_images: bool = False


def load_custom(config, seed: int, validation_fraction: float) -> DatasetSource:
    """Call the user's function, check what it returned, split a single dataset, count the examples.

    Raises:
        ConfigError: the function cannot be imported (bwopt.schema.targets).
        DataError: naming data._target_: not a Dataset or a pair of them, not (features, label)
            examples, features of no fixed shape or of a non-numeric type, an endless dataset, or a
            label outside [0, data.num_classes).
    """
    function = resolve_target(KEY, config._target_)
    returned = function(**config.kwargs)
    target = f"{KEY}={config._target_!r}"
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        train, validation = (checked(dataset, f"{target} ({part})") for dataset, part in zip(returned, PARTS))
        if train.element_spec != validation.element_spec:
            raise DataError(
                f"{target}: the train and validation datasets differ: {train.element_spec} against "
                f"{validation.element_spec}; return datasets of the same examples"
            )
        num_train = count_examples(train, config.num_classes, target, None)[0]
        num_validation = count_examples(validation, config.num_classes, target, None)[0]
    else:
        dataset = checked(returned, target)
        held_out = held_out_test(seed, validation_fraction)
        num_train, num_validation = count_examples(dataset, config.num_classes, target, held_out)
        train, validation = split(dataset, held_out)
    features = train.element_spec[0]
    return DatasetSource(
        train,
        validation,
        tuple(features.shape.as_list()),
        features.dtype.name,
        config.num_classes,
        config.feature_scale,
        num_train,
        num_validation,
    )


def checked(dataset, target: str):
    """The dataset with int32 labels, once it is known to be one of (features, label) examples."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"{target} returned a {type(dataset).__name__}; expected a tf.data.Dataset of (features, label) "
            "examples or a (train, validation) pair of them"
        )
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(part, tf.TensorSpec) for part in spec)):
        raise DataError(f"{target} yields {spec}; expected (features, label) pairs of tensors")
    features, label = spec
    if not features.shape.is_fully_defined():
        raise DataError(
            f"{target} yields features of shape {features.shape}; bwopt batches them, so every example needs "
            "the same, known shape (resize or pad them, or set it with tf.ensure_shape)"
        )
    if not (features.dtype.is_floating or features.dtype.is_integer):
        raise DataError(f"{target} yields features of type {features.dtype.name}; expected numbers (decode them)")
    if not label.dtype.is_integer or label.shape.rank != 0:
        raise DataError(f"{target} yields labels of type {label.dtype.name}, shape {label.shape}; expected int scalars")
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise DataError(f"{target} repeats forever; return one epoch (bwopt repeats it, pipeline.* says how)")
    if label.dtype == tf.int32:
        return dataset
    return dataset.map(lambda features, label: (features, tf.cast(label, tf.int32)))


def held_out_test(seed: int, validation_fraction: float):
    """(index, example) -> whether example `index` of a single dataset is held out for validation."""
    import tensorflow as tf

    def held_out(index, example):
        draw = tf.random.stateless_uniform([], seed=tf.stack([tf.constant(seed, tf.int64), index]))
        return draw < validation_fraction

    return held_out


def split(dataset, held_out):
    """(train, validation) of a single dataset, by the `held_out` test of each example's index."""
    import tensorflow as tf

    def kept(index, example):
        return tf.logical_not(held_out(index, example))

    indexed = dataset.enumerate()
    train = indexed.filter(kept).map(lambda index, example: example)
    return train, indexed.filter(held_out).map(lambda index, example: example)


def count_examples(dataset, num_classes: int, target: str, held_out) -> Tuple[int, int]:
    """(examples kept, examples held out) in one pass over the labels; every label is checked.

    Raises:
        DataError: a label outside [0, num_classes), naming `target` and data.num_classes.
    """
    import tensorflow as tf

    def flag(index, example):
        return (held_out(index, example) if held_out else tf.constant(False)), example[1]

    def add(totals, batch):
        held, labels = batch
        num_held = tf.reduce_sum(tf.cast(held, tf.int64))
        return (
            totals[0] + tf.cast(tf.size(labels), tf.int64) - num_held,
            totals[1] + num_held,
            tf.minimum(totals[2], tf.cast(tf.reduce_min(labels), tf.int64)),
            tf.maximum(totals[3], tf.cast(tf.reduce_max(labels), tf.int64)),
        )

    # (kept, held out, lowest label, highest label)
    start = tuple(tf.constant(value, tf.int64) for value in (0, 0, 2**62, -1))
    flagged = dataset.enumerate().map(flag).batch(COUNT_BATCH)
    kept, held, lowest, highest = (int(value) for value in flagged.reduce(start, add))
    if kept + held and (lowest < 0 or highest >= num_classes):
        raise DataError(
            f"{target} yields labels from {lowest} to {highest}, outside [0, data.num_classes={num_classes}); "
            "set data.num_classes to the number of classes"
        )
    return kept, held
