"""The tf.data input pipeline, built from the pipeline config over host arrays."""

import numpy as np

from bwopt.schema import AUTOTUNE


def tf_count(value):
    """A pipeline count from config: 'autotune' becomes tf.data.AUTOTUNE."""
    import tensorflow as tf

    return tf.data.AUTOTUNE if value == AUTOTUNE else value


def build_dataset(config, features: np.ndarray, labels: np.ndarray, batch_size: int, *, training: bool, seed: int):
    """Batches of (features in the transfer dtype, int32 labels).

    Training data is shuffled and repeated forever (the loop decides how many steps to take),
    with `drop_remainder` so that every step sees the same number of examples.
    """
    import tensorflow as tf

    transfer_dtype = tf.dtypes.as_dtype(config.transfer_dtype)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    dataset = dataset.map(
        lambda x, y: (tf.cast(x, transfer_dtype), y),
        num_parallel_calls=tf_count(config.map_parallelism) if config.map_parallelism != 1 else None,
        deterministic=config.deterministic,
    )
    if config.cache == "memory":
        dataset = dataset.cache()
    elif config.cache == "file":
        dataset = dataset.cache(f"{config.cache_path}{'train' if training else 'validation'}")
    if training:
        if config.shuffle_buffer > 0:
            dataset = dataset.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=training)
    if config.prefetch != 0:
        dataset = dataset.prefetch(tf_count(config.prefetch))
    options = tf.data.Options()
    options.deterministic = config.deterministic
    return dataset.with_options(options)
