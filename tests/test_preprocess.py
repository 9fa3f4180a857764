"""Image preprocessing (bwopt.preprocess) and where the pipeline puts it: shapes, the same crop with
or without fused decoding, draws keyed by the image (not its order), and never a cache after a
random stage."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import compose_config

from bwopt.app import validate
from bwopt.image_pipeline import EncodedImages, build_image_dataset
from bwopt.pipeline import image_file_elements
from bwopt.preprocess import (
    Decoding,
    center_cropped,
    center_window,
    decode_window,
    element_seeds,
    epoch_seeds,
    identity_seeds,
    image_identity,
    random_window,
    randomly_cropped,
    resize,
)
from bwopt.schema import ConfigError

SIZE = (24, 32)


def encoded_images(count=12, fmt="jpeg"):
    """(encoded images of assorted sizes, labels): smooth pictures, so decoders agree closely."""
    encode = tf.io.encode_jpeg if fmt == "jpeg" else tf.io.encode_png
    images, labels = [], []
    for index in range(count):
        height, width = 40 + 8 * index, 56 + 4 * (index % 3)
        rows, columns = np.mgrid[0:height, 0:width]
        image = np.stack([rows * 200 // height, columns * 200 // width, np.full_like(rows, 10 * index)], -1)
        images.append(encode(image.astype(np.uint8)).numpy())
        labels.append(index % 3)
    return images, np.array(labels, np.int32)


def image_pipeline(*overrides, training=True, seed=0, batch=4, fmt="jpeg", folder=None):
    """The image pipeline over `encoded_images`: their bytes as elements, or, given a folder, the
    files written there, as (path, label, identity) elements like an image folder's."""
    config = validate(
        compose_config(
            ["pipeline.preprocess=imagenet", "pipeline.vectorized_map=false", "data=sample_images"]
            + [f"pipeline.{override}" for override in overrides]
        )
    ).pipeline
    images, labels = encoded_images(fmt=fmt)
    if folder is None:
        elements, encoded = tf.data.Dataset.from_tensor_slices((images, labels)), EncodedImages(SIZE)
    else:
        paths = np.array([str(folder / f"{index:02d}.{fmt}") for index in range(len(images))])
        for path, image in zip(paths, images):
            Path(path).write_bytes(image)
        elements = image_file_elements(paths, labels, np.arange(len(paths)))
        encoded = EncodedImages(SIZE, paths=True, jpeg_only=fmt == "jpeg")
    return build_image_dataset(config, elements, batch, training=training, seed=seed, images=encoded)


def ops(dataset):
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return [node.op for node in graph.node if node.op.endswith("Dataset") or "Dataset" in node.op]


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("training", [True, False])
def test_training_and_validation_images_have_the_configured_size(training, fmt):
    features, labels = next(iter(image_pipeline("transfer_dtype=uint8", training=training, fmt=fmt)))
    assert features.shape == (4, *SIZE, 3) and features.dtype == tf.uint8 and labels.dtype == tf.int32
    floats = next(iter(image_pipeline("transfer_dtype=float32", training=training, fmt=fmt)))[0]
    assert floats.dtype == tf.float32 and 0 <= floats.numpy().min() and floats.numpy().max() <= 255


@pytest.mark.slow
def test_a_fixed_seed_gives_the_same_crops_at_any_parallelism_and_another_seed_other_crops():
    def first_batches(seed, parallelism):
        dataset = image_pipeline(f"map_parallelism={parallelism}", "shuffle_buffer=0", seed=seed)
        return [features.numpy() for features, _ in dataset.take(6)]

    serial = first_batches(0, 1)
    assert all(np.array_equal(a, b) for a, b in zip(serial, first_batches(0, 4)))
    assert not all(np.array_equal(a, b) for a, b in zip(serial, first_batches(1, 1)))
    # Later epochs draw new crops of the same images (3 batches of 4 = one epoch of 12).
    assert not np.array_equal(serial[0], serial[3])


@pytest.mark.parametrize("training", [True, False])
def test_fused_and_unfused_decoding_give_the_same_window(training):
    fused = next(iter(image_pipeline("fused_decode_crop=true", "shuffle_buffer=0", training=training)))[0]
    whole = next(iter(image_pipeline("fused_decode_crop=false", "shuffle_buffer=0", training=training)))[0]
    assert fused.shape == whole.shape
    # The same window of the same image: only libjpeg's partial decoding may differ, by a level or
    # two, in few pixels (here at most 2 levels, in under 1 % of them)
    difference = np.abs(fused.numpy().astype(float) - whole.numpy())
    assert difference.mean() < 0.5 and difference.max() <= 2 and (difference > 0).mean() < 0.05


def test_the_windows_follow_model_garden():
    jpeg = encoded_images(1)[0][0]  # 40 x 56
    image = tf.io.decode_jpeg(jpeg)
    offset, size = center_window(tf.shape(image))
    assert offset.numpy().tolist() == [3, 11] and size.numpy().tolist() == [35, 35]  # 0.875 x 40 = 35
    for seed in range(20):
        offset, size = random_window(tf.constant([seed, 0], tf.int64))(tf.shape(image))
        area = size.numpy().prod() / (40 * 56)
        assert 0.08 <= area <= 1.0 and np.all(offset.numpy() + size.numpy() <= [40, 56])
        window = decode_window(jpeg, random_window(tf.constant([seed, 0], tf.int64)), Decoding(SIZE))
        assert window.shape[:2] == tuple(size.numpy())
    assert center_cropped(jpeg, Decoding(SIZE)).shape == (*SIZE, 3)
    seeds = tf.constant([[0, 14], [0, 15]], tf.int64)
    assert randomly_cropped(jpeg, seeds, Decoding(SIZE, False)).shape == (*SIZE, 3)


def test_the_flip_after_resizing_gives_the_pixels_of_model_gardens_flip_before_it():
    decoding = Decoding(SIZE)
    flipped = 0
    for index, jpeg in enumerate(encoded_images(6)[0]):
        for draw in range(4):
            seeds = tf.constant([[index, draw], [draw, index]], tf.int64)
            crop = decode_window(jpeg, random_window(seeds[0]), decoding)
            garden = resize(tf.image.stateless_random_flip_left_right(crop, seeds[1]), decoding).numpy()
            ours = randomly_cropped(jpeg, seeds, decoding).numpy()
            assert np.abs(ours.astype(int) - garden).max() <= 1 and np.mean(ours == garden) > 0.99
            flipped += not np.array_equal(ours, resize(crop, decoding).numpy())
    assert 0 < flipped < 24  # the coin falls both ways


def test_an_images_seeds_depend_on_its_identity_the_epoch_and_the_run_seed_only():
    jpegs = encoded_images(4)[0]
    identities = [image_identity(jpeg) for jpeg in jpegs] + [tf.constant(index, tf.int64) for index in range(4)]
    seeds = {
        (index, epoch, seed): element_seeds(identity, epoch, seed).numpy()
        for index, identity in enumerate(identities)
        for epoch in (0, 1)
        for seed in (0, 7)
    }
    first = seeds[0, 0, 0]
    assert first.shape == (2, 2) and first.dtype == np.int64 and not np.array_equal(first[0], first[1])
    assert len({tuple(pair.reshape(-1)) for pair in seeds.values()}) == len(seeds)  # each its own
    again = element_seeds(image_identity(tf.constant(jpegs[0])), tf.constant(0, tf.int64), 0)
    assert np.array_equal(again, first)  # the same bytes, the same seeds, every call


def test_an_images_seeds_are_its_identity_and_the_epoch_stream_whichever_way_they_are_worked_out():
    """[[identity, stream], [~identity, stream]], stream = epoch << 32 ^ the seed's low 32 bits:
    element by element, and from the two parts the pipeline works out apart, each for many at once."""
    identities, epochs = np.array([0, 5, -3, 2**40 + 7], np.int64), np.array([0, 1, 2, 2**20], np.int64)
    for seed in (0, 7, 2**33 + 1):
        streams = (epochs << 32) ^ (seed & 0xFFFFFFFF)
        expected = np.stack([np.stack([identities, streams], -1), np.stack([~identities, streams], -1)], -2)
        apart = identity_seeds(identities) + epoch_seeds(epochs, seed)
        assert np.array_equal(apart, expected)
        for index in range(len(identities)):
            one = element_seeds(tf.constant(identities[index]), tf.constant(epochs[index]), seed)
            assert np.array_equal(one, expected[index])


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["1", "4"])
def test_a_folders_training_images_are_its_files_cropped_with_their_own_seeds(parallelism, tmp_path):
    """Two epochs of a folder read in order: image i of epoch e is `randomly_cropped` of file i's
    bytes with element_seeds(i, e, seed), worked out here image by image."""
    seed, count = 3, 12
    pipeline = image_pipeline("shuffle_buffer=0", f"map_parallelism={parallelism}", seed=seed, folder=tmp_path)
    read = np.concatenate([features.numpy() for features, _ in pipeline.take(2 * count // 4)])
    files = sorted(tmp_path.iterdir())
    decoding = Decoding(SIZE, True, jpeg_only=True)
    for position, image in enumerate(read):
        epoch, index = divmod(position, count)
        seeds = element_seeds(tf.constant(index, tf.int64), tf.constant(epoch, tf.int64), seed)
        expected = randomly_cropped(tf.constant(files[index].read_bytes()), seeds, decoding)
        assert np.array_equal(image, tf.cast(expected, image.dtype)), (epoch, index)


@pytest.mark.slow
@pytest.mark.parametrize("as_files", [False, True], ids=["bytes", "files"])
def test_shuffling_moves_the_images_but_not_their_crops(as_files, tmp_path):
    """An epoch read shuffled holds the same crops as one read in order: a crop follows its image,
    whether the image is known by its bytes or by its place in a folder."""

    def one_epoch(*overrides):
        pipeline = image_pipeline(*overrides, "transfer_dtype=uint8", folder=tmp_path if as_files else None)
        images = [features.numpy() for features, _ in pipeline.take(3)]
        return sorted(image.tobytes() for batch in images for image in batch)

    in_order = one_epoch("shuffle_buffer=0")
    assert one_epoch("shuffle_buffer=12") == in_order
    assert one_epoch("shuffle_buffer=12", "map_parallelism=4", "deterministic=false") == in_order
    assert one_epoch("shuffle_buffer=12", "cache=memory", "map_parallelism=4", "deterministic=false") == in_order


@pytest.mark.parametrize("fused", [True, False])
def test_knowing_every_image_is_a_jpeg_changes_nothing_but_the_work(fused):
    jpegs = encoded_images(4)[0]
    seeds = tf.constant([[0, 6], [0, 7]], tf.int64)
    for jpeg in jpegs:
        tested, known = Decoding(SIZE, fused, jpeg_only=False), Decoding(SIZE, fused, jpeg_only=True)
        assert np.array_equal(randomly_cropped(jpeg, seeds, tested), randomly_cropped(jpeg, seeds, known))
        assert np.array_equal(center_cropped(jpeg, tested), center_cropped(jpeg, known))


def test_the_cache_holds_encoded_images_before_the_random_stage():
    """A cache after a random crop would replay the first epoch's crops forever."""
    graph = ops(image_pipeline("cache=memory"))
    cache = graph.index("CacheDatasetV2")
    assert "ZipDataset" in graph and cache < graph.index("ZipDataset")  # the decode follows the cache
    assert graph.index("ParallelMapDatasetV2") > cache
    batches = [features.numpy() for features, _ in image_pipeline("cache=memory", "shuffle_buffer=0").take(6)]
    assert not np.array_equal(batches[0], batches[3])  # epoch 2 of the same images in the same order


def test_validation_is_deterministic_and_cached_nowhere():
    first = [features.numpy() for features, _ in image_pipeline("cache=memory", training=False)]
    again = [features.numpy() for features, _ in image_pipeline("cache=memory", training=False, seed=5)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == 3


def test_preprocess_settings_are_checked_before_tensorflow_runs():
    with pytest.raises(ConfigError, match="pipeline.preprocess=imagenet .* pipeline.vectorized_map=true"):
        validate(compose_config(["data=sample_images", "pipeline.preprocess=imagenet", "pipeline=default"]))
    with pytest.raises(
        ConfigError, match="pipeline.preprocess=imagenet crops and resizes encoded images, which data=digits"
    ):
        validate(compose_config(["pipeline.preprocess=imagenet", "pipeline.vectorized_map=false"]))
    with pytest.raises(ConfigError, match="pipeline.preprocess='inception' is not allowed"):
        validate(compose_config(["data=sample_images", "pipeline.preprocess=inception"]))


def test_every_preprocess_name_has_its_builders():
    from bwopt.preprocess import PREPROCESSINGS as BUILDERS
    from bwopt.schema.pipeline import PREPROCESSINGS

    assert set(BUILDERS) == set(PREPROCESSINGS)


@pytest.mark.slow
def test_augmentation_rounds_follow_a_random_crop_reproducibly():
    def first_batch(parallelism):
        dataset = image_pipeline("augment_repeats=2", f"map_parallelism={parallelism}", "shuffle_buffer=0")
        return next(iter(dataset))[0].numpy()

    plain = next(iter(image_pipeline("augment_repeats=0", "shuffle_buffer=0")))[0].numpy()
    augmented = first_batch(1)
    assert augmented.shape == plain.shape and np.array_equal(augmented, first_batch(3))
    assert 0 < np.abs(augmented - plain).max() <= 2  # two rounds of at most one step each
