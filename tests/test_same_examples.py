"""A pipeline setting changes when examples arrive, never which ones or what they hold.

Two epochs of the training split are read in process, through tf.data alone (no model, no
training), with the seed fixed and shuffling off (`pipeline.shuffle_buffer=0`), through
`pipeline=naive`, `default` and `tuned` and through each knob those presets turn, and compared
as multisets of (features, label) examples with the same epochs read through the reference,
`pipeline=naive`. Augmentation is on (`pipeline.augment_repeats`): its noise is a function of the
example, the seed and the epoch only (bwopt.pipeline.make_augment), so the augmented examples are
the same too, epoch by epoch.

- Lossless settings give exactly the reference's examples. Integer features (the uint8 synthetic
  images here; digits; every image source) are exact in every transfer dtype, augmented or not.
- A lossy transfer dtype on float features gives the reference rounded to that dtype (to nearest):
  bfloat16 within 2^-8 of each value's magnitude (0.39 %), float16 within 2^-11 (0.049 %; 2^-25
  absolute below 2^-14). Augmentation there is keyed by the transferred values, so float features
  are compared unaugmented.
- With `deterministic=false` a parallel stage may hand examples out of order, so an example near the
  end of an epoch may come after one of the next epoch: there the two epochs read must hold all of
  the reference's first epoch and be part of its first three.
- Encoded images (data=sample_images, pipeline.preprocess=imagenet) get random crops and flips keyed
  by the image's identity (a file's place in its folder's file list), the seed and the epoch
  (bwopt.preprocess.element_seeds): the same crops whatever order the images come in, shuffled,
  read in parallel or out of order.
"""

import os
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
from conftest import compose_config, small_sample_images

from bwopt.app import validate
from bwopt.data.sources import load_source
from bwopt.inputs import LABEL_BYTES, Inputs, plan
from bwopt.strategies import build_strategy, distribute_input

BATCH = 16
# 200 examples, 40 held out (split=uniform): 160 training examples, 10 batches an epoch
SYNTHETIC = [
    "data=synthetic",
    "data.num_examples=200",
    "data.image_shape=[4,4,3]",
    "split=uniform",
    f"train.global_batch_size={BATCH}",
    "pipeline.shuffle_buffer=0",
    "pipeline.augment_repeats=3",
]
ARTIFICIAL = [  # a file source: 4 files of 48 (3, 144 examples, for training), read through interleave
    "data=artificial",
    "split=uniform",
    "data.num_files=4",
    "data.examples_per_file=48",
    "data.element_latency_s=0",
    "data.num_classes=7",
    f"train.global_batch_size={BATCH}",
    "pipeline.shuffle_buffer=0",
    "pipeline.augment_repeats=3",
]
PRESETS = ["pipeline=naive", "pipeline=default", "pipeline=tuned"]
# Every knob a preset turns, each on top of pipeline=naive.
KNOBS = [
    "pipeline.prefetch=autotune",
    "pipeline.prefetch=3",
    "pipeline.map_parallelism=autotune",
    "pipeline.map_parallelism=4",
    "pipeline.vectorized_map=true",
    "pipeline.deterministic=false",
    "pipeline.cache=memory",
    "pipeline.transfer_dtype=uint8",
    "pipeline.transfer_dtype=bfloat16",
    "pipeline.transfer_dtype=float16",
    "pipeline.options.autotune=true",
    "pipeline.options.map_and_batch_fusion=true",
    "pipeline.options.map_parallelization=true",
    "pipeline.options.parallel_batch=true",
    "pipeline.options.inject_prefetch=true",
    "pipeline.options.noop_elimination=false",
    "pipeline.options.slack=true",
    "pipeline.options.private_threadpool_size=2",
    "pipeline.options.max_intra_op_parallelism=1",
]
# Parallel and vectorised maps that may also reorder: the knobs together, as tuned turns them.
REORDERING = ["pipeline.map_parallelism=4", "pipeline.deterministic=false", "pipeline.vectorized_map=true"]
TFRECORD_READS = [
    [],
    ["pipeline.tfrecord.num_parallel_reads=autotune"],
    ["pipeline.tfrecord.num_parallel_reads=3", "pipeline.tfrecord.num_shards=3"],
    ["pipeline.tfrecord.compression=GZIP", "pipeline.map_parallelism=autotune"],
    ["pipeline=tuned"],
]
FILE_PIPELINES = [  # the artificial features are float32 (small integers): no uint8 transfer
    ["pipeline=default"],
    ["pipeline=tuned", "pipeline.transfer_dtype=bfloat16"],
    ["pipeline.interleave.cycle_length=autotune"],
    ["pipeline.interleave.cycle_length=2", "pipeline.interleave.num_parallel_calls=2"],
    ["pipeline.interleave.num_parallel_calls=autotune", "pipeline.interleave.cycle_length=3"],
    ["pipeline.interleave.block_length=4", "pipeline.interleave.cycle_length=3"],
]
DISTRIBUTE = [
    [],
    ["pipeline.distribute.method=distribute_datasets_from_function"],
    ["pipeline.distribute.fetch_to_device=true", "pipeline.distribute.per_replica_buffer_size=2"],
    ["pipeline.distribute.auto_shard_policy=OFF"],
    ["pipeline.distribute.auto_shard_policy=DATA"],
    ["pipeline=tuned"],
    ["pipeline=tuned", "pipeline.distribute.method=distribute_datasets_from_function"],
]
# Knobs that may reorder encoded images before their random crop; parallel, out-of-order reads
# into a cache; shuffling on top (the reference reads unshuffled). A vectorised map is refused.
IMAGE_PIPELINES = [
    ["pipeline=tuned", "pipeline.vectorized_map=false"],
    ["pipeline=default", "pipeline.vectorized_map=false"],
    ["pipeline.map_parallelism=4", "pipeline.deterministic=false"],
    ["pipeline.map_parallelism=4", "pipeline.deterministic=false", "pipeline.cache=memory"],
    ["pipeline.shuffle_buffer=64"],
    ["pipeline.shuffle_buffer=64", "pipeline.map_parallelism=autotune", "pipeline.deterministic=false"],
]
# Relative rounding of a value to nearest in each transfer dtype (half its spacing); float16
# values below its smallest normal (2^-14) are subnormal, spaced 2^-24 apart.
ROUNDING = {"bfloat16": 2**-8, "float16": 2**-11}
FLOAT16_ABSOLUTE = 2**-25


def tiered(cases):
    """The cases that turn pipeline=tuned in the fast tier, the others marked slow (each about a second)."""
    return [case if "pipeline=tuned" in case else pytest.param(case, marks=pytest.mark.slow) for case in cases]


def configure(*overrides):
    return validate(compose_config(list(overrides)))


def inputs_of(config):
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    return Inputs(config, source, plan(config, source))


def read(config, num_batches: int):
    """`num_batches` training batches through tf.data: (features as float32, labels)."""
    batches = list(inputs_of(config).dataset(True).take(num_batches))
    features = np.concatenate([tf.cast(features, tf.float32).numpy() for features, _ in batches])
    return features, np.concatenate([labels.numpy() for _, labels in batches])


def read_distributed(config, num_batches: int, devices):
    """The same through a MirroredStrategy over 2 logical CPUs and pipeline.distribute: every replica's part."""
    inputs = inputs_of(config)
    strategy = build_strategy(config.strategy, devices)
    distributed = distribute_input(strategy, config.pipeline.distribute, lambda context: inputs.dataset(True, context))
    parts = []
    for _, (features, labels) in zip(range(num_batches), distributed):
        for replica_features, replica_labels in zip(
            strategy.experimental_local_results(features), strategy.experimental_local_results(labels)
        ):
            parts.append((tf.cast(replica_features, tf.float32).numpy(), replica_labels.numpy()))
    return np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])


def examples(features, labels) -> Counter:
    """The multiset of (label, features' bytes as float32)."""
    return Counter((int(label), row.astype(np.float32).tobytes()) for row, label in zip(features, labels))


def num_train(config) -> int:
    return plan(config, load_source(config.data, config.seed, config.split.validation_fraction)).num_train_examples


def assert_same_examples(config, candidate, reference_read) -> None:
    """`candidate`: two epochs read; `reference_read(num_epochs)`: the reference's first epochs."""
    epoch = num_train(config)
    assert len(candidate[1]) == 2 * epoch
    read = examples(*candidate)
    if config.pipeline.deterministic:
        assert read == examples(*reference_read(2)), "the examples differ from pipeline=naive's"
        return
    first, three = examples(*reference_read(1)), examples(*reference_read(3))
    assert not first - read, "an example of the first epoch is missing"
    assert not read - three, "an example is none of pipeline=naive's"


@pytest.fixture(scope="module")
def reference():
    """pipeline=naive's first epochs for a data set-up, read once: (overrides) -> epochs -> (features, labels)."""
    cache = {}

    def epochs(overrides, num_epochs):
        key = (tuple(overrides), num_epochs)
        if key not in cache:
            config = configure(*overrides, "pipeline=naive")
            cache[key] = read(config, num_epochs * num_train(config) // BATCH)
        return cache[key]

    return epochs


def check(reference, data, *overrides, reader=read):
    config = configure(*data, *overrides)
    candidate = reader(config, 2 * num_train(config) // BATCH)
    assert_same_examples(config, candidate, lambda num_epochs: reference(data, num_epochs))


@pytest.mark.slow
def test_the_reference_reads_every_training_example_once_an_epoch_and_augments_it(reference):
    config = configure(*SYNTHETIC)
    assert num_train(config) == 160 and config.pipeline.shuffle_buffer == 0
    inputs = inputs_of(config)
    indices = inputs.input_plan.train_indices
    stored = examples(inputs.source.features[indices], inputs.source.labels[indices])
    features, labels = reference(SYNTHETIC, 2)
    first, second = examples(features[:160], labels[:160]), examples(features[160:], labels[160:])
    assert first != stored and first != second  # augmented, and afresh each epoch
    unaugmented = read(configure(*SYNTHETIC, "pipeline=naive", "pipeline.augment_repeats=0"), 10)
    assert examples(*unaugmented) == stored
    assert np.abs(features[:160] - unaugmented[0]).max() <= 3  # 3 rounds of at most one step each


@pytest.mark.parametrize("overrides", PRESETS)
@pytest.mark.slow
def test_every_preset_reads_the_same_examples(reference, overrides):
    check(reference, SYNTHETIC, overrides)


@pytest.mark.slow  # about 0.7 s a knob
@pytest.mark.parametrize("overrides", KNOBS)
def test_every_knob_of_the_presets_reads_the_same_examples(reference, overrides):
    check(reference, SYNTHETIC, overrides)


def test_knobs_that_reorder_change_no_example(reference):
    check(reference, SYNTHETIC, *REORDERING)
    check(reference, SYNTHETIC, *REORDERING, "pipeline.cache=memory", "pipeline.transfer_dtype=uint8")


def test_a_file_cache_reads_the_same_examples(reference, tmp_path):
    check(reference, SYNTHETIC, "pipeline.cache=file", f"pipeline.cache_path={tmp_path / 'cache'}")


@pytest.mark.parametrize("overrides", tiered(TFRECORD_READS), ids=lambda overrides: " ".join(overrides) or "serial")
def test_tfrecord_reads_give_the_same_examples(reference, tmp_path, overrides):
    check(reference, SYNTHETIC, "pipeline.tfrecord.enabled=true", f"pipeline.tfrecord.directory={tmp_path}", *overrides)


@pytest.mark.parametrize("overrides", tiered(FILE_PIPELINES), ids=" ".join)
@pytest.mark.slow
def test_interleaved_files_give_the_same_examples(reference, overrides):
    check(reference, ARTIFICIAL, *overrides)


@pytest.mark.parametrize("overrides", tiered(DISTRIBUTE), ids=lambda overrides: " ".join(overrides) or "default")
def test_distributed_inputs_give_the_same_examples(reference, devices, overrides):
    check(
        reference,
        SYNTHETIC,
        "strategy=mirrored",
        *overrides,
        reader=lambda config, num_batches: read_distributed(config, num_batches, devices),
    )


@pytest.fixture(scope="module")
def sample_images(tmp_path_factory):
    """data=sample_images: 60 small JPEGs, 48 for training (3 batches), imagenet's random crops and flips."""
    return [
        *small_sample_images(tmp_path_factory.mktemp("sample_images"), 60),
        "pipeline.transfer_dtype=uint8",
        f"train.global_batch_size={BATCH}",
        "pipeline.shuffle_buffer=0",
        "train.warmup_steps=1",  # 3 steps an epoch
        "train.epoch_warmup_steps=0",
    ]


def test_the_image_reference_crops_afresh_every_epoch(reference, sample_images):
    features, labels = reference(sample_images, 2)
    assert len(labels) == 96 and features.shape[1:] == (16, 16, 3)
    assert examples(features[:48], labels[:48]) != examples(features[48:], labels[48:])


@pytest.mark.parametrize("overrides", tiered(IMAGE_PIPELINES), ids=" ".join)
@pytest.mark.slow
def test_encoded_images_get_the_same_crops_whatever_their_order(reference, sample_images, overrides):
    check(reference, sample_images, *overrides)


@pytest.mark.parametrize("dtype", sorted(ROUNDING))
@pytest.mark.slow
def test_a_narrower_transfer_dtype_rounds_float_features_within_its_tolerance(dtype):
    data = [*SYNTHETIC, "data.dtype=float32", "pipeline.augment_repeats=0"]
    stored, labels = read(configure(*data, "pipeline=naive"), 20)
    rounded = tf.cast(tf.cast(stored, dtype), tf.float32).numpy()
    epoch = len(labels) // 2  # unaugmented: every epoch holds the same examples

    def rounded_epochs(num_epochs):
        return np.concatenate([rounded[:epoch]] * num_epochs), np.concatenate([labels[:epoch]] * num_epochs)

    for preset in PRESETS:
        config = configure(*data, preset, f"pipeline.transfer_dtype={dtype}")
        assert_same_examples(config, read(config, 20), rounded_epochs)
    error = np.abs(rounded - stored)
    assert error.max() > 0  # the rounding is real: float32 values do not fit exactly
    bound = ROUNDING[dtype] * np.abs(stored)
    if dtype == "float16":
        bound = np.maximum(bound, FLOAT16_ABSOLUTE)
    assert np.all(error <= bound)


@pytest.mark.parametrize("overrides", tiered(IMAGE_PIPELINES[:3]), ids=" ".join)
def test_fused_decoding_gets_the_same_crops_whatever_the_pipeline(reference, sample_images, overrides):
    """Decoding only the crop window (experiment=imagenet_like sweeps it) keeps the same examples
    under every pipeline, the reference decoding the same way."""
    check(reference, [*sample_images, "pipeline.fused_decode_crop=true"], *overrides)


def cached_element_spec(dataset):
    """The element spec of what the pipeline's cache holds (the first cache up its inputs, through zips)."""
    if "Cache" in type(dataset).__name__:
        return dataset.element_spec
    inputs = getattr(dataset, "_datasets", None) or [getattr(dataset, "_input_dataset", None)]
    for spec in (cached_element_spec(input) for input in inputs if input is not None):
        if spec is not None:
            return spec
    return None


@pytest.mark.parametrize(
    "overrides",
    [
        ["pipeline.cache=memory"],
        ["pipeline.cache=memory", "pipeline.map_parallelism=4", "pipeline.deterministic=false"],
        ["pipeline.cache=file"],
    ],
    ids=" ".join,
)
@pytest.mark.slow
def test_a_cache_of_decoded_images_gets_the_same_crops_as_decoding_every_epoch(
    reference, sample_images, tmp_path, overrides
):
    from bwopt.memory import stored_element_bytes

    data = [*sample_images, "pipeline.fused_decode_crop=false"]
    if "pipeline.cache=file" in overrides:
        overrides = [*overrides, f"pipeline.cache_path={tmp_path / 'cache'}"]
    check(reference, data, *overrides)
    config = configure(*data, *overrides)
    inputs = inputs_of(config)
    image = cached_element_spec(inputs.dataset(True))[0]  # None if there were no cache
    assert image.dtype == tf.uint8 and image.shape.as_list() == [None, None, 3]  # decoded, not bytes
    fused = cached_element_spec(inputs_of(configure(*sample_images, *overrides)).dataset(True))[0]
    assert fused.dtype == tf.string  # a fused decode is random: the cache holds the file's bytes
    # The memory check counts each decoded image as its header says: as many bytes as decoding them gives.
    files = inputs.source.files[inputs.input_plan.train_indices]
    decoded = [tf.io.decode_jpeg(tf.io.read_file(str(path))).numpy().nbytes for path in files]
    assert stored_element_bytes(config, inputs.source, inputs.input_plan) == int(np.mean(decoded)) + LABEL_BYTES
    # without a cache the images are decoded after the shuffle, whose buffer holds the files' bytes
    file_bytes = [os.path.getsize(path) for path in files]
    uncached = stored_element_bytes(configure(*data), inputs.source, inputs.input_plan)
    assert uncached == int(np.mean(file_bytes)) + LABEL_BYTES < int(np.mean(decoded))
