"""Host arrays materialised as sharded TFRecord files, cached by content, and read back with tf.data."""

import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from bwopt.data.records import OPENERS
from bwopt.schema import AUTOTUNE

MANIFEST = "manifest.json"
# Examples per batch when timing a read pass; large enough that per-batch Python cost is noise.
MEASURE_BATCH_SIZE = 1024
# Bump when the file layout changes, so that old caches are not mistaken for new ones.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class TFRecordFiles:
    """A materialised data set: one tf.train.Example per example, dealt over shard files.

    Attributes:
        paths: the shard files, in shard order.
        compression: "NONE", "GZIP" or "ZLIB".
        feature_shape: shape of one example's features.
        feature_dtype: NumPy dtype name of the features (e.g. "uint8").
        num_examples: examples over all shards.
        bytes_on_disk: sum of the shard file sizes (the manifest excluded).
        raw_bytes: features + labels as they were in memory (`nbytes` of both arrays).
    """

    paths: List[str]
    compression: str
    feature_shape: Tuple[int, ...]
    feature_dtype: str
    num_examples: int
    bytes_on_disk: int
    raw_bytes: int

    @property
    def compression_ratio(self) -> float:
        """raw_bytes / bytes_on_disk; below 1 when the per-record overhead outweighs compression."""
        return self.raw_bytes / self.bytes_on_disk


def materialise(
    features: np.ndarray, labels: np.ndarray, directory: Path, num_shards: int, compression: str
) -> TFRecordFiles:
    """Write `features` and `labels` as TFRecord shards under `directory / <content key>`, once.

    Example i holds `features[i].tobytes()` (C order, native byte order) as the bytes feature
    "features" and `labels[i]` as the int64 feature "label". Examples are dealt to shards in
    contiguous blocks in their original order (sizes differ by at most one, like
    `numpy.array_split`), so shard k holds a contiguous range of indices.

    The content key hashes the feature and label bytes, their dtypes and shapes, `num_shards`
    and `compression`: identical content is written once and later calls reuse the files
    untouched. The shards and `manifest.json` are written into a temporary folder next to the
    final one and renamed into place, so an interrupted write never leaves a partial cache (a
    killed process may leave a hidden `.<key>-*` staging folder behind, never a `<key>` folder).

    Raises:
        ValueError: on an unknown compression, mismatched lengths, non-integer labels, or a
            num_shards outside [1, num_examples].
    """
    _check_inputs(features, labels, num_shards, compression)
    directory = Path(directory)
    folder = directory / content_key(features, labels, num_shards, compression)
    if not folder.exists():
        directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=directory))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            _write_shards(features, labels, staging, num_shards, compression)
            _rename_into_place(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
    return load(folder)


def _check_inputs(features: np.ndarray, labels: np.ndarray, num_shards: int, compression: str) -> None:
    if compression not in OPENERS:
        raise ValueError(f"unknown compression {compression!r}; expected one of: {', '.join(OPENERS)}")
    if labels.ndim != 1 or len(labels) != len(features):
        raise ValueError(f"labels must have shape ({len(features)},) to match the features; got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers; got dtype {labels.dtype}")
    if not 1 <= num_shards <= len(features):
        raise ValueError(f"num_shards={num_shards} is outside [1, {len(features)}] (the number of examples)")


def content_key(features: np.ndarray, labels: np.ndarray, num_shards: int, compression: str) -> str:
    """First 16 hex digits of a sha256 over everything that decides the files' content."""
    header = {
        "format_version": FORMAT_VERSION,
        "features": [features.dtype.str, list(features.shape)],
        "labels": [labels.dtype.str, list(labels.shape)],
        "num_shards": num_shards,
        "compression": compression,
    }
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    digest.update(np.ascontiguousarray(features).view(np.uint8).reshape(-1))
    digest.update(np.ascontiguousarray(labels).view(np.uint8).reshape(-1))
    return digest.hexdigest()[:16]


def _write_shards(features: np.ndarray, labels: np.ndarray, folder: Path, num_shards: int, compression: str) -> None:
    import tensorflow as tf

    options = tf.io.TFRecordOptions(compression_type=tf_compression(compression))
    blocks = np.array_split(np.arange(len(features)), num_shards)
    names = [f"shard-{index:05d}-of-{num_shards:05d}.tfrecord" for index in range(num_shards)]
    for name, block in zip(names, blocks):
        with tf.io.TFRecordWriter(str(folder / name), options) as writer:
            for index in block:
                writer.write(_example(features[index], labels[index]))
    manifest = {
        "format_version": FORMAT_VERSION,
        "shards": names,
        "bytes_per_shard": [os.path.getsize(folder / name) for name in names],
        "examples_per_shard": [len(block) for block in blocks],
        "num_examples": len(features),
        "num_shards": num_shards,
        "compression": compression,
        "feature_shape": list(features.shape[1:]),
        "feature_dtype": features.dtype.name,
        "label_dtype": labels.dtype.name,
        "raw_bytes": int(features.nbytes + labels.nbytes),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _example(features: np.ndarray, label) -> bytes:
    import tensorflow as tf

    feature = {
        "features": tf.train.Feature(bytes_list=tf.train.BytesList(value=[features.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _rename_into_place(staging: Path, folder: Path) -> None:
    """Atomic on one file system; a concurrent writer that got there first wins and is reused."""
    try:
        os.rename(staging, folder)
    except OSError:
        if not (folder / MANIFEST).exists():
            raise


def load(folder: Path) -> TFRecordFiles:
    """The TFRecordFiles of a folder written by `materialise`, sizes read from the files themselves."""
    manifest = json.loads((Path(folder) / MANIFEST).read_text())
    paths = [str(Path(folder) / name) for name in manifest["shards"]]
    return TFRecordFiles(
        paths=paths,
        compression=manifest["compression"],
        feature_shape=tuple(manifest["feature_shape"]),
        feature_dtype=manifest["feature_dtype"],
        num_examples=manifest["num_examples"],
        bytes_on_disk=sum(os.path.getsize(path) for path in paths),
        raw_bytes=manifest["raw_bytes"],
    )


def tf_count(value):
    """A count from config: 'autotune' becomes tf.data.AUTOTUNE (bwopt.pipeline uses it too)."""
    import tensorflow as tf

    return tf.data.AUTOTUNE if value == AUTOTUNE else value


def tf_compression(compression: str) -> str:
    # TFRecordDataset and TFRecordOptions spell "no compression" as the empty string.
    return "" if compression == "NONE" else compression


FEATURE_KEY = "features"
LABEL_KEY = "label"


def example_parser(
    feature_key: str, label_key: str, feature_dtype: str, feature_shape: Sequence[int], num_classes: int = 0
):
    """record -> (features of `feature_shape` decoded from raw bytes, int32 label).

    A record that does not fit fails with a message naming the config key to check: a missing
    key (data.feature_key, data.label_key), a feature of the wrong size (data.feature_shape,
    data.feature_dtype), a label outside [0, num_classes) (data.num_classes; 0 skips the check).
    """
    import numpy as np
    import tensorflow as tf

    dtype = tf.dtypes.as_dtype(feature_dtype)
    expected_bytes = int(np.prod(feature_shape)) * dtype.size
    schema = {
        feature_key: tf.io.FixedLenFeature([], tf.string, default_value=""),
        label_key: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, schema)
        raw, label = example[feature_key], example[label_key]
        checks = [
            tf.debugging.assert_equal(
                tf.strings.length(raw),
                expected_bytes,
                message=f"bad record: data.feature_key={feature_key!r} is missing or holds the wrong number of "
                f"bytes for data.feature_shape={list(feature_shape)} of data.feature_dtype={feature_dtype} "
                f"({expected_bytes} bytes)",
            ),
            tf.debugging.assert_non_negative(
                label, message=f"bad record: data.label_key={label_key!r} is missing or negative"
            ),
        ]
        if num_classes:
            checks.append(
                tf.debugging.assert_less(
                    label,
                    tf.constant(num_classes, tf.int64),
                    message=f"bad record: a label is outside [0, data.num_classes={num_classes})",
                )
            )
        with tf.control_dependencies(checks):
            features = tf.reshape(tf.io.decode_raw(raw, dtype), feature_shape)
        return features, tf.cast(label, tf.int32)

    return parse


def read_dataset(
    files: TFRecordFiles,
    num_parallel_reads: Union[int, str, None],
    buffer_size_bytes: Optional[int],
    num_parallel_calls: Union[int, str, None],
):
    """A tf.data.Dataset of (features in their original shape and dtype, int32 label).

    Args:
        files: what `materialise` returned.
        num_parallel_reads: shard files read at once (None or 1: one after the other, in order;
            more: interleaved, so the order of examples changes); int or "autotune".
        buffer_size_bytes: read buffer per file (None: TensorFlow's default, 256 KiB).
        num_parallel_calls: parallelism of parsing (None: serial); int or "autotune".
    """
    import tensorflow as tf

    parse = example_parser(FEATURE_KEY, LABEL_KEY, files.feature_dtype, files.feature_shape)
    records = tf.data.TFRecordDataset(
        files.paths,
        compression_type=tf_compression(files.compression),
        buffer_size=buffer_size_bytes,
        num_parallel_reads=tf_count(num_parallel_reads),
    )
    return records.map(parse, num_parallel_calls=tf_count(num_parallel_calls))


def measure_read_throughput(
    files: TFRecordFiles,
    num_parallel_reads: Union[int, str, None],
    buffer_size_bytes: Optional[int],
    repeats: int = 1,
) -> Dict[str, float]:
    """How fast `read_dataset` turns the files into host tensors.

    One pass reads every shard (decompressing), parses every example and decodes its features
    (parsing autotuned), in batches of `MEASURE_BATCH_SIZE` so that Python's per-element cost
    stays out of the figure. The pass time is the median of `repeats` passes; each pass
    includes opening the files. Files just written usually sit in the OS page cache, so this
    measures decompression and parsing, not the disk.

    Returns:
        read_bytes_per_s: bytes_on_disk / pass time; read_examples_per_s: num_examples / pass
        time; pass_time_s; num_examples (counted in the last pass); bytes_on_disk.

    Raises:
        ValueError: if repeats < 1.
        RuntimeError: if a pass did not yield exactly `files.num_examples` examples.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be at least 1")
    pass_times_s = []
    for _ in range(repeats):
        batches = read_dataset(files, num_parallel_reads, buffer_size_bytes, AUTOTUNE).batch(MEASURE_BATCH_SIZE)
        start = time.perf_counter()
        num_examples = sum(int(labels.shape[0]) for _, labels in batches)
        pass_times_s.append(time.perf_counter() - start)
        if num_examples != files.num_examples:
            raise RuntimeError(f"a pass read {num_examples} examples; the files hold {files.num_examples}")
    pass_time_s = statistics.median(pass_times_s)
    return {
        "read_bytes_per_s": files.bytes_on_disk / pass_time_s,
        "read_examples_per_s": files.num_examples / pass_time_s,
        "pass_time_s": pass_time_s,
        "num_examples": num_examples,
        "bytes_on_disk": files.bytes_on_disk,
    }
