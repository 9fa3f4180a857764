"""Encoded images as a data source: files in class folders, and JPEGs inside TFRecord files.

The examples stay encoded until the input pipeline: a source hands it the file bytes (or the
record's bytes feature) and `bwopt.preprocess` decodes, crops and resizes each one in a map, so
decoding is host work that the pipeline's knobs (map parallelism, cache, prefetch...) act on.
Listing the files needs no TensorFlow.
"""

import os
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import List, Tuple

import numpy as np

from bwopt.data.records import DataError
from bwopt.schema.data import IMAGE_EXTENSIONS

# Decoded pixels are 8-bit: the device scales them to [0, 1].
PIXEL_SCALE = 1.0 / 255.0


@dataclass
class ImageFileSource:
    """Image files and their labels; split and sharded by file, like the examples of an ArraySource.

    Attributes:
        files: every image's path, sorted by class folder, then path.
        labels: int32 class ids, shape (num_files,): the index of the file's class folder.
        class_names: the class folders' names, sorted; label i is class_names[i].
        image_size: (height, width) every image is decoded and resized to.
    """

    files: np.ndarray
    labels: np.ndarray
    class_names: List[str]
    image_size: Tuple[int, int]
    feature_scale: float = PIXEL_SCALE
    step_compute_s: float = 0.0
    value_range: Tuple[float, float] = (0.0, 255.0)
    encoded_images: bool = True

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def feature_shape(self) -> Tuple[int, ...]:
        return (*self.image_size, 3)

    @property
    def feature_dtype(self) -> str:
        return "uint8"

    @cached_property
    def jpeg_only(self) -> bool:
        """Every file is named as a JPEG: the pipeline then tests no image's format."""
        return all(str(path).lower().endswith((".jpg", ".jpeg")) for path in self.files)


def list_image_folder(directory: str, key: str = "data.directory") -> Tuple[List[str], np.ndarray, List[str]]:
    """(paths, int32 labels, class names) of a folder laid out for image_dataset_from_directory.

    Each sub-folder of `directory` is a class, in sorted order of the names; its files with an image
    extension (any case), found recursively, are its examples, sorted by path. Files directly in
    `directory` and files of other types are ignored.

    Raises:
        DataError: naming `key` and the path: not a folder, fewer than 2 classes holding an image,
            no image at all, or an image path that is not a regular file (a pipe, a dangling link).
    """
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"{key}={directory!r} is not a folder; expected one sub-folder of images per class")
    class_names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    paths, labels = [], []
    for label, name in enumerate(class_names):
        found = sorted(
            os.path.join(folder, file)
            for folder, _, files in os.walk(root / name)
            for file in files
            if file.lower().endswith(IMAGE_EXTENSIONS)
        )
        paths += found
        labels += [label] * len(found)
    if not paths:
        raise DataError(
            f"{key}={directory!r} holds no image ({', '.join(IMAGE_EXTENSIONS)}) in a class sub-folder; expected "
            "one sub-folder of images per class"
        )
    if len(set(labels)) < 2:
        raise DataError(
            f"{key}={directory!r} has images in {len(set(labels))} class folder(s) ({', '.join(class_names)}); "
            "a classifier needs at least 2"
        )
    for path in paths:
        check_regular_file(path, key)
    return paths, np.asarray(labels, dtype=np.int32), class_names


def check_regular_file(path: str, key: str) -> None:
    """A DataError naming the path and `key` when it is not a regular file that can be reached."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:  # a dangling link, a link loop, no permission
        raise DataError(f"{path}: cannot be read ({error.strerror}); check the files under {key}") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"{path}: is not a regular file (a pipe, socket or device); remove it from {key}")


def load_images(config, seed: int, validation_fraction: float) -> ImageFileSource:
    """data=images: the files of `data.directory`; the split is made by bwopt.inputs.plan."""
    paths, labels, class_names = list_image_folder(config.directory)
    return ImageFileSource(np.asarray(paths), labels, class_names, tuple(config.image_size))


def image_record_parser(feature_key: str, label_key: str, num_classes: int):
    """record -> (encoded image bytes, int32 label), TF Model Garden's ImageNet layout.

    A record that does not fit fails with a message naming the key to check, as bwopt's raw
    parser does: the image missing or empty (data.feature_key), the label missing or negative
    (data.label_key), or not below data.num_classes.
    """
    import tensorflow as tf

    schema = {
        feature_key: tf.io.FixedLenFeature([], tf.string, default_value=""),
        label_key: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, schema)
        encoded, label = example[feature_key], example[label_key]
        checks = [
            tf.debugging.assert_positive(
                tf.strings.length(encoded),
                message=f"bad record: data.feature_key={feature_key!r} is missing or empty (data.format=image)",
            ),
            tf.debugging.assert_non_negative(
                label, message=f"bad record: data.label_key={label_key!r} is missing or negative"
            ),
            tf.debugging.assert_less(
                label,
                tf.constant(num_classes, tf.int64),
                message=f"bad record: a label is outside [0, data.num_classes={num_classes})",
            ),
        ]
        with tf.control_dependencies(checks):
            return tf.identity(encoded), tf.cast(label, tf.int32)

    return parse
