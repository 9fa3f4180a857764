"""data=images (class folders) and data=tfrecord data.format=image: listed without TensorFlow, split
by file, decoded in the pipeline."""

import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import compose_config

from bwopt.app import validate
from bwopt.data.images import list_image_folder
from bwopt.data.records import DataError
from bwopt.data.sources import load_source
from bwopt.inputs import Inputs, plan

TINY = ["train.epochs=1", "train.warmup_steps=1", "train.steps_per_epoch=3", "measure.memcpy_bandwidth=false"]


def write_image(path: Path, seed: int, size=(20, 28)) -> None:
    """A small smooth RGB image (a random colour plus gradients), its format taken from the file's extension."""
    from PIL import Image

    colour = np.random.default_rng(seed).integers(0, 128, 3)
    rows, columns = np.mgrid[0 : size[0], 0 : size[1]]
    gradient = 100 * rows[..., None] / size[0] + 20 * columns[..., None] / size[1]
    pixels = (colour + gradient).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(
        path, format={".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP"}[path.suffix.lower()]
    )


def image_folder(root: Path, counts=None) -> Path:
    """Class folders of tiny JPEG, PNG and BMP files: {'cat': 6, 'dog': 9, 'emu': 3} by default."""
    for label, (name, count) in enumerate((counts or {"cat": 6, "dog": 9, "emu": 3}).items()):
        for index in range(count):
            suffix = (".jpg", ".png", ".JPG", ".bmp")[index % 4]
            write_image(root / name / f"{index:03d}{suffix}", seed=100 * label + index, size=(20 + index, 28))
    return root


def config_of(folder: Path, *overrides):
    return validate(
        compose_config([*TINY, "data=images", f"data.directory={folder}", "data.image_size=[12,16]", *overrides])
    )


def test_the_folder_is_listed_like_image_dataset_from_directory(tmp_path):
    folder = image_folder(tmp_path / "images")
    write_image(folder / "dog" / "nested" / "deep.jpeg", seed=1)  # found recursively
    (folder / "dog" / "notes.txt").write_text("not an image")  # ignored: not an image extension
    write_image(folder / "top.jpg", seed=2)  # ignored: not in a class folder
    paths, labels, class_names = list_image_folder(str(folder))
    assert class_names == ["cat", "dog", "emu"]
    assert Counter(labels.tolist()) == {0: 6, 1: 10, 2: 3}
    assert all(Path(path).parent.name == class_names[label] or "nested" in path for path, label in zip(paths, labels))
    assert labels.dtype == np.int32 and paths == sorted(paths)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda root: root.mkdir(), "holds no image"),
        (lambda root: (root / "cat").mkdir(parents=True), "holds no image"),
        (lambda root: image_folder(root, {"cat": 3}), r"has images in 1 class folder\(s\) \(cat\)"),
        (
            lambda root: (image_folder(root, {"cat": 3}) / "dog").mkdir(),
            r"has images in 1 class folder\(s\) \(cat, dog\)",
        ),
        (lambda root: None, "is not a folder"),
    ],
)
def test_a_folder_that_cannot_be_a_data_set_is_refused_naming_the_key(tmp_path, make, message):
    root = tmp_path / "images"
    make(root)
    with pytest.raises(DataError, match=f"data.directory='{root}'.* {message}"):
        list_image_folder(str(root))


def test_an_image_path_that_is_not_a_regular_file_is_named(tmp_path):
    folder = image_folder(tmp_path / "images", {"cat": 2, "dog": 2})
    os.mkfifo(folder / "dog" / "pipe.jpg")  # reading it would block
    with pytest.raises(DataError, match=f"{folder / 'dog' / 'pipe.jpg'}: is not a regular file.*data.directory"):
        list_image_folder(str(folder))
    (folder / "dog" / "pipe.jpg").unlink()
    (folder / "dog" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(DataError, match="gone.png: cannot be read"):
        list_image_folder(str(folder))


@pytest.mark.parametrize("split", ["uniform", "stratified"])
def test_the_split_is_by_file_disjoint_and_stratified_keeps_each_class_share(tmp_path, split):
    folder = image_folder(tmp_path / "images", {"cat": 10, "dog": 20, "emu": 30})
    config = config_of(folder, f"split={split}", "split.validation_fraction=0.2", "train.global_batch_size=8")
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    sizes = plan(config, source)
    train, validation = set(sizes.train_indices), set(sizes.validation_indices)
    assert not train & validation and train | validation == set(range(60))
    assert sizes.num_validation_examples == 12
    if split == "stratified":  # each class holds out round(0.2 x its size)
        assert Counter(source.labels[sizes.validation_indices].tolist()) == {0: 2, 1: 4, 2: 6}


def test_images_are_decoded_and_resized_in_the_pipeline_with_their_labels(tmp_path):
    folder = image_folder(tmp_path / "images")
    config = config_of(folder, "split=stratified", "train.global_batch_size=4", "pipeline.transfer_dtype=uint8")
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    assert (source.feature_shape, source.num_classes, source.feature_scale) == ((12, 16, 3), 3, 1 / 255)
    inputs = Inputs(config, source, plan(config, source))
    batches = list(inputs.dataset(training=False))
    features = np.concatenate([batch[0].numpy() for batch in batches])
    labels = np.concatenate([batch[1].numpy() for batch in batches])
    assert features.shape == (len(inputs.input_plan.validation_indices), 12, 16, 3) and features.dtype == np.uint8
    assert labels.tolist() == source.labels[inputs.input_plan.validation_indices].tolist()
    # The decoded pixels are the file's, resized: the first validation file, decoded by PIL.
    from PIL import Image

    first = Image.open(source.files[inputs.input_plan.validation_indices[0]]).convert("RGB")
    expected = np.asarray(first.resize((16, 12), Image.BILINEAR), dtype=np.float32)
    assert np.abs(features[0].astype(np.float32) - expected).mean() < 4  # decoders and resamplers differ a little
    training = next(iter(inputs.dataset(training=True)))
    assert training[0].shape == (4, 12, 16, 3) and set(training[1].numpy()) <= {0, 1, 2}


def test_the_memory_cache_holds_decoded_images_when_decoding_is_deterministic(tmp_path):
    """preprocess=none: the file read and the decode come before the cache, so a cached epoch reads no file."""
    folder = image_folder(tmp_path / "images", {"cat": 4, "dog": 4})
    config = config_of(folder, "split=uniform", "train.global_batch_size=2", "pipeline.cache=memory")
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    inputs = Inputs(config, source, plan(config, source))
    iterator = iter(inputs.dataset(training=True))
    first_epoch = [next(iterator)[0].numpy() for _ in range(3)]  # 6 training files: one epoch
    for path in source.files:
        os.remove(path)
    later_epochs = [next(iterator)[0].numpy() for _ in range(6)]  # no file left to read
    assert later_epochs[0].shape == first_epoch[0].shape


def test_with_a_random_preprocessing_the_cache_holds_the_files_bytes_and_every_epoch_new_crops(tmp_path):
    """preprocess=imagenet: the files are read before the cache, decoded and cropped after it."""
    folder = image_folder(tmp_path / "images", {"cat": 4, "dog": 4})
    overrides = ["train.global_batch_size=6", "pipeline.cache=memory", "pipeline.shuffle_buffer=0"]
    imagenet = ["pipeline.preprocess=imagenet", "pipeline.vectorized_map=false"]
    config = config_of(folder, "split=uniform", *overrides, *imagenet)
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    inputs = Inputs(config, source, plan(config, source))
    iterator = iter(inputs.dataset(training=True))
    first_epoch = next(iterator)[0].numpy()  # the 6 training files, in order
    for path in source.files:
        os.remove(path)
    later_epochs = [next(iterator)[0].numpy() for _ in range(3)]  # no file left to read
    assert all(not np.array_equal(first_epoch, later) for later in later_epochs)


@pytest.mark.slow
def test_an_end_to_end_run_on_an_image_folder_finishes(run_experiment, tmp_path):
    folder = image_folder(tmp_path / "images", {"cat": 12, "dog": 12})
    summary = run_experiment(
        *TINY,
        "tracking=none",
        "data=images",
        f"data.directory={folder}",
        "data.image_size=[16,16]",
        "model=cnn",
        "train.global_batch_size=4",
    )
    assert summary.status == "FINISHED" and summary.figures.num_timed_steps == 2


# --- data=tfrecord data.format=image -----------------------------------------------------------


def image_records(path: Path, labels, key="image/encoded", label_key="image/class/label") -> Path:
    """TF Model Garden's ImageNet layout: JPEG bytes and an int64 label per tf.train.Example."""
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index, label in enumerate(labels):
            jpeg = tf.io.encode_jpeg(np.full((24 + index, 30, 3), 40 * label, np.uint8)).numpy()
            feature = {
                key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


def jpeg_records_config(folder: Path, *overrides):
    return validate(
        compose_config(
            [
                "data=tfrecord",
                "split=uniform",
                "data.format=image",
                f"data.file_pattern={folder}/*.tfrecord",
                "data.feature_key=image/encoded",
                "data.label_key=image/class/label",
                "data.feature_shape=[10,12,3]",
                "data.num_classes=3",
                "train.global_batch_size=4",
                *TINY,
                *overrides,
            ]
        )
    )


@pytest.mark.slow
def test_jpeg_records_in_model_gardens_layout_are_decoded_in_the_pipeline(tmp_path):
    for index in range(3):
        image_records(tmp_path / "records" / f"train-{index}.tfrecord", [0, 1, 2, index])
    config = jpeg_records_config(tmp_path / "records", "pipeline.transfer_dtype=uint8")
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    assert (source.num_train_examples, source.num_validation_examples, source.encoded_images) == (8, 4, True)
    inputs = Inputs(config, source, plan(config, source))
    features, labels = next(iter(inputs.dataset(training=False)))
    assert features.shape == (4, 10, 12, 3) and features.dtype.name == "uint8"
    # Each image is one flat grey of 40 x label: decoding and resizing keep it (JPEG rounding aside).
    assert np.allclose(features.numpy().mean(axis=(1, 2, 3)), 40 * labels.numpy(), atol=2)
    assert next(iter(inputs.dataset(training=True)))[0].shape == (4, 10, 12, 3)


@pytest.mark.slow
def test_jpeg_records_tell_the_pipeline_their_count_without_a_pass_over_them(tmp_path):
    """A random stage needs the examples per pass: the files' remembered record counts give it, so
    a build reads no record (a pass over ImageNet's 1.28 M would cost each run tens of seconds);
    with skip_bad_records, which can drop records, the count is left to a pass."""
    from bwopt.pipeline import epoch_size

    for index in range(3):
        image_records(tmp_path / "records" / f"train-{index}.tfrecord", [0, 1, 2, index])
    for skip, expected in ((False, 8), (True, -2)):  # -2: tf.data.UNKNOWN_CARDINALITY
        config = jpeg_records_config(
            tmp_path / "records",
            "pipeline.preprocess=imagenet",
            "pipeline.vectorized_map=false",
            f"data.skip_bad_records={str(skip).lower()}",
        )
        source = load_source(config.data, config.seed, config.split.validation_fraction)
        elements = Inputs(config, source, plan(config, source)).elements(training=True)
        assert int(elements.cardinality()) == expected
        assert epoch_size(elements) == 8 and sum(1 for _ in elements) == 8


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["data.feature_key=image/missing"],
            r"data.feature_key='image/missing' is missing or empty \(data.format=image\)",
        ),
        (["data.num_classes=2"], r"a label is outside \[0, data.num_classes=2\)"),
    ],
)
def test_a_jpeg_record_that_does_not_fit_is_named_with_its_file_and_key(tmp_path, overrides, message):
    import tensorflow as tf

    from bwopt.data.diagnose import diagnose

    image_records(tmp_path / "records" / "train-0.tfrecord", [0, 1, 2, 2])
    image_records(tmp_path / "records" / "train-1.tfrecord", [0, 1])
    config = jpeg_records_config(tmp_path / "records", *overrides)
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    inputs = Inputs(config, source, plan(config, source))
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(inputs.dataset(training=True).take(2))  # train-0.tfrecord: 4 records, one batch
    # What the run reports (bwopt.modes.run_mode): the file, the record and the key.
    data_error = diagnose(source, "tfrecord", raised.value)
    assert data_error is not None and re.search(f"train-0.tfrecord: record [0-9]+: {message}", str(data_error))
