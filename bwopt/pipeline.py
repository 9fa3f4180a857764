"""The tf.data input pipeline: every knob of conf/pipeline/ applied to a real tf.data graph.

Order of the training pipeline (validation skips shuffle, repeat, augmentation, cache and the
service):

    elements  in-memory slices | TFRecord shards | files via interleave | image files' paths |
              the user's dataset
    map       cast to the transfer dtype (none when the features already have that dtype);
              encoded images: read (paths), decode and resize first, in the same map, when the
              preprocessing is deterministic (pipeline.preprocess, bwopt.preprocess)
    cache / snapshot
    shuffle, repeat
    map       encoded images, a random preprocessing (imagenet's, training): read (paths, unless
              a cache needed the bytes before), decode a random crop, flip, resize, cast; then
              augmentation rounds (when on)
    batch     with vectorized_map, the cast and augmentation run as one map after batch instead,
              and cache and snapshot hold the elements before the cast
    tf.data service (when on), prefetch, Options

Every random stage comes after the cache: caching after it would freeze one draw for every epoch.
"""

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from bwopt.data.tfrecord import tf_count


def array_elements(features: np.ndarray, labels: np.ndarray):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((features, labels))


def image_file_elements(paths: np.ndarray, labels: np.ndarray, identities: np.ndarray):
    """(path, label, identity seeds) elements of image files: each file's place in its folder's
    file list is its identity, the key of its random crop, given as the image's part of its
    seeds (bwopt.preprocess.identity_seeds, worked out here for every file at once;
    EncodedImages.paths)."""
    import tensorflow as tf

    from bwopt.preprocess import identity_seeds

    seeds = identity_seeds(np.asarray(identities, dtype=np.int64))
    return tf.data.Dataset.from_tensor_slices((paths, labels, seeds))


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


def make_augment(config, value_range: Optional[tuple], seed: int, elements):
    """`augment_repeats` rounds of random jitter, or None when there are none.

    Each round moves every value by -1, 0 or +1 quantisation step (probabilities 1/4, 1/2, 1/4;
    clipped to the source's range at the end): real elementwise work on the host, a knob for
    making a workload input-bound. It runs after the cache, so it is paid, and different, every
    epoch. The noise is a counter-based hash of the example's values (as float32), the run's seed,
    the epoch and the value's index, never of the order or the thread an example is processed in:
    the speed knobs (parallel or vectorised map, deterministic=false, cache, reads) change when an
    augmented example arrives, never what it holds (tests/test_same_examples.py).

    The function takes ((features, labels), positions) of one example or of a batch; an example's
    position in the repeated stream of `elements` // the examples per pass is its epoch.
    """
    import tensorflow as tf

    if not config.augment_repeats:
        return None
    examples_per_epoch = epoch_size(elements)

    def uint32(value: int):
        return tf.constant(value & 0xFFFFFFFF, tf.uint32)

    def mix(x):
        # lowbias32 (C. Wellons' integer hash): every output bit depends on every input bit
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, uint32(16))) * uint32(0x7FEB352D)
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, uint32(15))) * uint32(0x846CA68B)
        return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, uint32(16)))

    def augment(example, positions):
        features, labels = example
        values = tf.cast(features, tf.float32)
        flat = tf.reshape(values, [tf.size(positions), -1])  # one row per example
        content = tf.bitcast(tf.fingerprint(flat)[:, :4], tf.uint32)
        epochs = tf.cast(tf.reshape(positions, [-1]) // examples_per_epoch, tf.uint32)
        keys = mix(tf.bitwise.bitwise_xor(content, mix(epochs + uint32(seed * 0x9E3779B9))))
        index = tf.cast(tf.range(tf.shape(flat)[1]), tf.uint32) * uint32(0x9E3779B9)
        state = mix(tf.bitwise.bitwise_xor(keys[:, None], index[None, :]))
        for _ in range(config.augment_repeats):
            state = state * uint32(747796405) + uint32(2891336453)  # one LCG step per round
            up = tf.cast(tf.bitwise.right_shift(state, uint32(31)), tf.float32)
            down = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(state, uint32(30)), uint32(1)), tf.float32)
            flat = flat + (up - down)
        values = tf.reshape(flat, tf.shape(values))
        if value_range is not None:
            values = tf.clip_by_value(values, *value_range)
        return tf.cast(values, features.dtype), labels

    return augment


def epoch_size(elements) -> int:
    """Examples in one pass of `elements`: their cardinality, or counted once when tf.data cannot tell."""
    size = int(elements.cardinality())
    return size if size >= 0 else int(elements.reduce(np.int64(0), lambda count, _: count + 1))


@dataclass(frozen=True)
class Maps:
    """The per-example work of one pipeline; `assemble` puts each where the ordering rules say.

    Attributes:
        cast: (features, label) -> (features, label): deterministic, before the cache (or, with
            vectorized_map, after batch).
        decode: ((encoded, label), key) -> (features, label): random, per element, after
            repeat, its random choices keyed by the image and its epoch (the position in the
            repeated stream // the examples per pass); never vectorised (the images differ in size).
            Its key is `position_key` of the element's position, or the position when there is none.
        position_key: positions -> what `decode` needs of them, vectorised: the pipeline works it out
            for a block of positions at a time (each operation of a per-element map costs
            about a microsecond per element: eleven of them were 3 % of a small JPEG's work).
        augment: (features, label) -> (features, label): random, after repeat (or after batch).
    """

    cast: Optional[Callable] = None
    decode: Optional[Callable] = None
    position_key: Optional[Callable] = None
    augment: Optional[Callable] = None


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
    maps = Maps(
        cast=make_cast(config) if needs_cast else None,
        augment=make_augment(config, value_range, seed, elements) if training else None,
    )
    return assemble(config, elements, maps, batch_size, training=training, seed=seed, service=service)


# Positions whose Maps.position_key is worked out at once.
POSITION_BLOCK = 1024


def assemble(config, elements, maps: Maps, batch_size: int, *, training: bool, seed: int, service):
    """The pipeline's stages in order (module docstring), `maps` placed by the ordering rules."""
    import tensorflow as tf

    parallel = parallel_arguments(config, config.map_parallelism)
    options = dataset_options(config)
    vectorized = config.vectorized_map
    dataset = elements
    if maps.cast and not vectorized:
        dataset = dataset.map(maps.cast, **parallel)
    augment = maps.augment if training else None
    if training:
        dataset = cache_and_snapshot(config, dataset)
        if config.shuffle_buffer > 0:
            shuffle_seed = seed if config.shuffle_seed is None else config.shuffle_seed
            dataset = dataset.shuffle(config.shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
        if maps.decode or augment:
            # Each element with its position in the stream, whose epoch its random stages draw
            # from (a range, not Dataset.counter(), a scan that calls a function per element).
            positions = tf.data.Dataset.range(np.iinfo(np.int64).max)
            if maps.position_key:
                keyed = positions.batch(POSITION_BLOCK).map(lambda block: (block, maps.position_key(block)))
                positions = keyed.unbatch()
            dataset = tf.data.Dataset.zip((dataset, positions))
        if maps.decode or (augment and not vectorized):
            apply = per_element(maps.decode, None if vectorized else augment, keyed=bool(maps.position_key))
            dataset = dataset.map(apply, **parallel)
    dataset = dataset.batch(batch_size, drop_remainder=training)
    if vectorized and (maps.cast or augment):

        def preprocess(*batch):
            (features, labels), positions = batch if augment else (batch, None)
            features, labels = maps.cast(features, labels) if maps.cast else (features, labels)
            return augment((features, labels), positions) if augment else (features, labels)

        dataset = dataset.map(preprocess, **parallel)
    if service is not None:
        # The service's workers run the graph as registered: give it the options first.
        dataset = service(dataset.with_options(options))
    if config.prefetch != 0:
        dataset = dataset.prefetch(tf_count(config.prefetch))
    return dataset.with_options(options)


def per_element(decode: Optional[Callable], augment: Optional[Callable], keyed: bool = False) -> Callable:
    """(example, position) -> decode, then augment, each when there is one, with the position;
    `keyed`: the position comes as (position, decode's key) (Maps.position_key)."""

    def apply(example, position):
        position, key = position if keyed else (position, position)
        example = decode(example, key) if decode else example
        return augment(example, position) if augment else example

    return apply


def caches(pipeline) -> bool:
    """Whether the training pipeline keeps its first epoch's elements: a cache or a snapshot."""
    return pipeline.cache != "off" or bool(pipeline.snapshot.path)


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
