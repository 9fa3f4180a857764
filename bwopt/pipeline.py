"""The tf.data input pipeline: every knob of conf/pipeline/ applied to a real tf.data graph.

Order of the training pipeline (validation skips shuffle, repeat, augmentation, cache and the
service):

    elements  in-memory slices | TFRecord shards | files via interleave
    map       cast to the transfer dtype (none when    } with vectorized_map, both maps run
              the features already have that dtype)    }
    cache / snapshot                                   } as one after batch, and cache and
    shuffle, repeat                                    } snapshot hold the raw elements
    map       augmentation rounds (when on)            }
    batch
    tf.data service (when on), prefetch, Options
"""

from typing import Callable, Optional, Sequence

import numpy as np

from bwopt.data.tfrecord import tf_count


def array_elements(features: np.ndarray, labels: np.ndarray):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((features, labels))


def file_elements(config, paths: Sequence[str], open_file: Callable):
    """Elements of many files, read `interleave.cycle_length` at a time."""
    import tensorflow as tf

    interleave = config.interleave
    parallel = interleave.num_parallel_calls
    return tf.data.Dataset.from_tensor_slices(list(paths)).interleave(
        open_file,
        cycle_length=tf_count(interleave.cycle_length),
        block_length=interleave.block_length,
        **parallel_arguments(config, parallel),
    )


def parallel_arguments(config, parallelism) -> dict:
    """num_parallel_calls and deterministic for a map or interleave; none when it runs serially."""
    if parallelism == 1:
        return {}
    return {"num_parallel_calls": tf_count(parallelism), "deterministic": config.deterministic}


def make_cast(config):
    """Cast features to the transfer dtype: the deterministic part of preprocessing."""
    import tensorflow as tf

    transfer_dtype = tf.dtypes.as_dtype(config.transfer_dtype)
    return lambda features, labels: (tf.cast(features, transfer_dtype), labels)


def make_augment(config, value_range: Optional[tuple]):
    """`augment_repeats` rounds of random jitter, or None when there are none.

    Each round moves every value by -1, 0 or +1 quantisation step (uniform noise, rounded,
    clipped to the source's range): real elementwise work on the host, a knob for making a
    workload input-bound. It runs after the cache, so it is paid, and different, every epoch.
    """
    import tensorflow as tf

    if not config.augment_repeats:
        return None

    def augment(features, labels):
        values = tf.cast(features, tf.float32)
        for _ in range(config.augment_repeats):
            values = tf.round(values + tf.random.uniform(tf.shape(values), -1.0, 1.0))
        if value_range is not None:
            values = tf.clip_by_value(values, *value_range)
        return tf.cast(values, features.dtype), labels

    return augment


def build_dataset(
    config,
    elements,
    batch_size: int,
    *,
    training: bool,
    seed: int,
    value_range: Optional[tuple] = None,
    service: Optional[Callable] = None,
):
    """Batches of (features in the transfer dtype, int32 labels) from a dataset of elements.

    Training data is shuffled and repeated forever (the loop decides how many steps to take),
    with `drop_remainder` so that every step sees the same number of examples. Validation data
    is cast and batched only.

    Args:
        config: the pipeline config.
        elements: a tf.data.Dataset of single (features, label) examples.
        batch_size: examples per batch of this pipeline (global, or per replica).
        training: whether this is the training pipeline.
        seed: the run's seed (used when pipeline.shuffle_seed is null).
        value_range: (min, max) of the stored features, kept by augmentation.
        service: applied to the batched dataset to send it through the tf.data service.
    """
    import tensorflow as tf

    # A cast to the dtype the features already have is no work: leave the map out altogether.
    needs_cast = elements.element_spec[0].dtype != tf.dtypes.as_dtype(config.transfer_dtype)
    cast = make_cast(config) if needs_cast else None
    augment = make_augment(config, value_range) if training else None
    parallel = parallel_arguments(config, config.map_parallelism)
    options = dataset_options(config)
    dataset = elements
    if cast and not config.vectorized_map:
        dataset = dataset.map(cast, **parallel)
    if training:
        dataset = cache_and_snapshot(config, dataset)
        if config.shuffle_buffer > 0:
            shuffle_seed = seed if config.shuffle_seed is None else config.shuffle_seed
            dataset = dataset.shuffle(config.shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
        if augment and not config.vectorized_map:
            dataset = dataset.map(augment, **parallel)
    dataset = dataset.batch(batch_size, drop_remainder=training)
    if config.vectorized_map and (cast or augment):

        def preprocess(features, labels):
            features, labels = cast(features, labels) if cast else (features, labels)
            return augment(features, labels) if augment else (features, labels)

        dataset = dataset.map(preprocess, **parallel)
    if service is not None:
        # The service's workers run the graph as registered: give it the options first.
        dataset = service(dataset.with_options(options))
    if config.prefetch != 0:
        dataset = dataset.prefetch(tf_count(config.prefetch))
    return dataset.with_options(options)


def cache_and_snapshot(config, dataset):
    if config.cache == "memory":
        dataset = dataset.cache()
    elif config.cache == "file":
        dataset = dataset.cache(config.cache_path)
    if config.snapshot.path:
        dataset = dataset.snapshot(config.snapshot.path, compression=config.snapshot.compression)
    return dataset


def dataset_options(config):
    """tf.data.Options from pipeline.options, pipeline.deterministic and the auto-shard policy."""
    import tensorflow as tf

    settings = config.options
    options = tf.data.Options()
    options.deterministic = config.deterministic
    options.autotune.enabled = settings.autotune
    if settings.autotune_ram_budget_mb is not None:
        options.autotune.ram_budget = settings.autotune_ram_budget_mb * 2**20
    if settings.autotune_cpu_budget is not None:
        options.autotune.cpu_budget = settings.autotune_cpu_budget
    if settings.private_threadpool_size:
        options.threading.private_threadpool_size = settings.private_threadpool_size
    if settings.max_intra_op_parallelism:
        options.threading.max_intra_op_parallelism = settings.max_intra_op_parallelism
    optimization = options.experimental_optimization
    optimization.map_and_batch_fusion = settings.map_and_batch_fusion
    optimization.map_parallelization = settings.map_parallelization
    optimization.noop_elimination = settings.noop_elimination
    optimization.parallel_batch = settings.parallel_batch
    # prefetch: 0 means no prefetching at all, not even the one tf.data would inject.
    optimization.inject_prefetch = settings.inject_prefetch and config.prefetch != 0
    options.experimental_slack = settings.slack
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, config.distribute.auto_shard_policy
    )
    return options
