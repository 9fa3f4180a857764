"""Data sources.

Four kinds: an `ArraySource` holds the whole data set as host arrays (digits, synthetic), so it
can be split by example and materialised as TFRecord shards; a `FileSource` streams examples
from files (artificial, the user's TFRecord files), split by file and read through interleave;
an `ImageFileSource` lists image files (images, sample_images: bwopt.data.images), split by
file like the examples of an array; a `DatasetSource` is the user's own tf.data function
(custom: bwopt.data.custom). Encoded images stay encoded until the pipeline decodes them.
Nothing here imports TensorFlow at module level.
"""

import glob
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bwopt.data.custom import load_custom
from bwopt.data.images import image_record_parser, load_images
from bwopt.data.records import DataError, check_regular_file, count_records
from bwopt.data.sample_images import load_sample_images


@dataclass
class ArraySource:
    """Features as stored on the host, and how the device turns them into model inputs.

    Attributes:
        features: raw features, shape (num_examples, *feature_shape), dtype as stored.
        labels: int32 class ids, shape (num_examples,).
        num_classes: number of classes.
        feature_scale: the device multiplies features by this after casting (e.g. 1/255).
    """

    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    feature_scale: float
    step_compute_s: float = 0.0
    encoded_images: bool = False

    @property
    def feature_shape(self) -> Tuple[int, ...]:
        return tuple(self.features.shape[1:])

    @property
    def feature_dtype(self) -> str:
        return self.features.dtype.name

    @property
    def value_range(self) -> Tuple[float, float]:
        return float(self.features.min()), float(self.features.max())


@dataclass
class FileSource:
    """Examples streamed from files.

    Attributes:
        train_files, validation_files: paths (or names) handed to `open_file`.
        open_file: path tensor -> tf.data.Dataset of (features, int32 label) examples.
        num_train_examples, num_validation_examples: examples in each set of files.
        step_compute_s: extra time each train step spends (the artificial workload).
        encoded_images: examples hold encoded images, which the pipeline decodes to `feature_shape`.
        count_examples: files -> the examples they hold, known without reading them again (TFRecord
            files' remembered record counts); None when only a pass over them would tell.
    """

    train_files: List[str]
    validation_files: List[str]
    open_file: Callable
    feature_shape: Tuple[int, ...]
    feature_dtype: str
    num_classes: int
    feature_scale: float
    num_train_examples: int
    num_validation_examples: int
    step_compute_s: float = 0.0
    value_range: Optional[Tuple[float, float]] = None
    encoded_images: bool = False
    count_examples: Optional[Callable[[List[str]], int]] = None


def load_digits() -> ArraySource:
    """scikit-learn's bundled digits: 8x8 images with 17 grey levels (0..16)."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    features = digits.images.astype(np.uint8)[..., np.newaxis]
    return ArraySource(features, digits.target.astype(np.int32), 10, 1.0 / 16.0)


def load_synthetic(config, seed: int) -> ArraySource:
    """Images around one random prototype per class; `signal` sets how far apart the classes are."""
    rng = np.random.default_rng(seed)
    shape = tuple(config.image_shape)
    labels = rng.integers(0, config.num_classes, size=config.num_examples, dtype=np.int32)
    prototypes = rng.standard_normal((config.num_classes, *shape), dtype=np.float32)
    features = np.empty((config.num_examples, *shape), dtype=np.float32)
    for start in range(0, config.num_examples, 256):  # bounded temporaries for big shapes
        chunk = labels[start : start + 256]
        noise = rng.standard_normal((len(chunk), *shape), dtype=np.float32)
        features[start : start + 256] = config.signal * prototypes[chunk] + noise
    if config.dtype == "uint8":
        features = np.clip(128.0 + 32.0 * features, 0, 255).astype(np.uint8)
        return ArraySource(features, labels, config.num_classes, 1.0 / 255.0)
    return ArraySource(features, labels, config.num_classes, 1.0)


def held_out_files(files: List[str], validation_fraction: float) -> Tuple[List[str], List[str]]:
    """The last round(fraction x files) files (at least one, never all) are validation."""
    if len(files) < 2:
        raise ValueError(f"{len(files)} file(s): at least 2 are needed to hold out validation files")
    num_validation = min(len(files) - 1, max(1, int(round(validation_fraction * len(files)))))
    return files[:-num_validation], files[-num_validation:]


def load_artificial(config, seed: int, validation_fraction: float) -> FileSource:
    """Virtual files whose opening and reading sleep for the configured latencies.

    An example's features are all equal to its label, so the model has something to learn.
    """
    names = [f"artificial-{index:04d}" for index in range(config.num_files)]
    train_files, validation_files = held_out_files(names, validation_fraction)
    shape = tuple(config.feature_shape)

    def examples(name):
        file_index = int(name.decode().rsplit("-", 1)[1])
        time.sleep(config.file_open_latency_s)
        for index in range(config.examples_per_file):
            time.sleep(config.element_latency_s)
            label = (file_index * config.examples_per_file + index) % config.num_classes
            yield np.full(shape, label, np.float32), np.int32(label)

    def open_file(name):
        import tensorflow as tf

        signature = (tf.TensorSpec(shape, tf.float32), tf.TensorSpec((), tf.int32))
        return tf.data.Dataset.from_generator(examples, output_signature=signature, args=(name,))

    return FileSource(
        train_files,
        validation_files,
        open_file,
        shape,
        "float32",
        config.num_classes,
        1.0,
        len(train_files) * config.examples_per_file,
        len(validation_files) * config.examples_per_file,
        step_compute_s=config.step_compute_s,
    )


def warn_if_not_held_out(train_files: Sequence[str], validation_files: Sequence[str]) -> None:
    """A warning when validation files are also training files (the same file by any path): the
    validation figures then measure memorisation, not what the model learned."""
    shared = sorted(set(map(os.path.realpath, train_files)) & set(map(os.path.realpath, validation_files)))
    if shared:
        print(
            f"bwopt: warning: data.validation_file_pattern matches {len(shared)} of the training files "
            f"(first: {shared[0]}); the validation figures are not on held-out data",
            file=sys.stderr,
        )


def load_tfrecord(config, seed: int, validation_fraction: float) -> FileSource:
    """The user's TFRecord files: `feature_key` holds raw bytes (data.format=raw) or an encoded
    image (data.format=image, decoded by the pipeline), `label_key` an int64."""
    train_files = sorted(glob.glob(config.file_pattern))
    if not train_files:
        raise DataError(f"data.file_pattern={config.file_pattern!r} matches no file")
    for path in train_files:  # a folder, a named pipe, a link loop: named before anything opens them
        check_regular_file(path)
    if config.validation_file_pattern:
        validation_files = sorted(glob.glob(config.validation_file_pattern))
        if not validation_files:
            raise DataError(f"data.validation_file_pattern={config.validation_file_pattern!r} matches no file")
        for path in validation_files:
            check_regular_file(path)
        warn_if_not_held_out(train_files, validation_files)
    elif len(train_files) < 2:
        raise DataError(
            f"data.file_pattern={config.file_pattern!r} matches 1 file, and holding out validation files "
            "needs at least 2; give more files or data.validation_file_pattern"
        )
    else:
        train_files, validation_files = held_out_files(train_files, validation_fraction)
    shape = tuple(config.feature_shape)

    def open_file(path):
        import tensorflow as tf

        from bwopt.data.tfrecord import example_parser, tf_compression

        if config.format == "image":
            parse = image_record_parser(config.feature_key, config.label_key, config.num_classes)
        else:
            parse = example_parser(
                config.feature_key, config.label_key, config.feature_dtype, shape, config.num_classes
            )
        records = tf.data.TFRecordDataset(path, compression_type=tf_compression(config.compression))
        examples = records.map(parse)
        # Opt-in: drop what does not parse; a damaged file ends at its first damaged record.
        return examples.ignore_errors() if config.skip_bad_records else examples

    def count(files):
        counts = [count_records(path, config.compression) for path in files]
        empty = [path for path, number in zip(files, counts) if number == 0]
        if empty:
            raise DataError(f"{empty[0]}: holds no record (data.file_pattern={config.file_pattern!r})")
        return sum(counts)

    return FileSource(
        train_files,
        validation_files,
        open_file,
        shape,
        config.feature_dtype,
        config.num_classes,
        config.feature_scale,
        count(train_files),
        count(validation_files),
        value_range=(0.0, 255.0) if config.format == "image" else None,
        encoded_images=config.format == "image",
        # Skipped records would make fewer examples than records.
        count_examples=None if config.skip_bad_records else count,
    )


ARRAY_SOURCES: Dict[str, Callable] = {"digits": lambda config, seed: load_digits(), "synthetic": load_synthetic}
# Sources not held as host arrays; each takes (config, seed, validation_fraction).
FILE_SOURCES: Dict[str, Callable] = {
    "artificial": load_artificial,
    "tfrecord": load_tfrecord,
    "images": load_images,
    "sample_images": load_sample_images,
    "custom": load_custom,
}


# Sources whose loading runs TensorFlow (the user's function builds tensors, and bwopt counts its
# examples), which fixes TensorFlow's devices: devices and strategy must be set up before them.
LOADED_WITH_TENSORFLOW = ("custom",)


def load_source(config, seed: int, validation_fraction: float = 0.2):
    """The source of `data.name`: an ArraySource, FileSource, ImageFileSource or DatasetSource."""
    if config.name in ARRAY_SOURCES:
        return ARRAY_SOURCES[config.name](config, seed)
    if config.name in FILE_SOURCES:
        return FILE_SOURCES[config.name](config, seed, validation_fraction)
    choices = ", ".join([*ARRAY_SOURCES, *FILE_SOURCES])
    raise ValueError(f"unknown data source {config.name!r}; expected one of: {choices}")
