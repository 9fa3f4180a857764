"""What a run's start costs on a large TFRecord data set: its files' records counted the first
time, remembered after (bwopt.data.records).

Two generated data sets, both written with TensorFlow's own TFRecordWriter under a temporary folder:

- ImageNet's count: 1,281,167 records (ImageNet's training split) of 64 bytes in 1,024 files,
  NONE compression: the per-record cost of counting (one header read and seek per record);
- JPEG records: about `BWOPT_RECORDS_GB` GB (default 2) of ImageNet TFRecords in TF Model
  Garden's layout (`image/encoded`: a real JPEG of about 110 kB, ImageNet's mean; `image/class/label`)
  in 64 files, NONE, and a tenth of it GZIP-compressed (counting decompresses the whole file),
  read with `data.format=image`.

For each, `load_source` (what a run does before training: list, check and count the files) is
timed with an empty count cache (the first run), then twice with the counts remembered (every
later run), all from the page cache (the files were just written; a cold disk costs the first
run more). The ratio first / later is what remembering saves. For the JPEG sets, the training pipeline
with `pipeline.preprocess=imagenet` (whose random crops need the examples per pass) is then built
twice: told the remembered counts, and with `data.skip_bad_records=true`, which can drop records
and so leaves the count to a pass over every record.

Run: `.venv/bin/python benchmarks/startup_records.py` (about 2 min and 2.5 GB of disk at the
default size); `BWOPT_BENCHMARK_SMOKE=1` makes the sets a thousand times smaller.
"""

import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import SMOKE, compose, load_line

IMAGENET_RECORDS = 1_281_167
JPEG_BYTES = 110_000
SCALE = 1000 if SMOKE else 1


def jpeg_record(target_bytes: int) -> bytes:
    """One serialized tf.train.Example in Model Garden's ImageNet layout, its JPEG about `target_bytes`."""
    import io

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    rng, side, encoded = np.random.default_rng(0), 64, b""
    while len(encoded) < target_bytes:  # noise compresses little: the size grows with the area
        side = int(side * 1.1) + 1
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
        encoded = buffer.getvalue()
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_set(folder: Path, num_files: int, num_records: int, record_bytes: int, compression: str) -> None:
    """`num_records` records in `num_files` files: JPEG examples when `record_bytes` is JPEG_BYTES, else raw bytes."""
    import numpy as np
    import tensorflow as tf

    folder.mkdir(parents=True)
    if record_bytes == JPEG_BYTES:
        payload = jpeg_record(JPEG_BYTES)
    else:
        payload = np.random.default_rng(0).integers(0, 256, record_bytes, dtype=np.uint8).tobytes()
    options = tf.io.TFRecordOptions(compression_type="" if compression == "NONE" else compression)
    per_file = max(1, num_records // num_files)
    for index in range(num_files):
        with tf.io.TFRecordWriter(str(folder / f"part-{index:05d}.tfrecord"), options) as writer:
            for _ in range(per_file):
                writer.write(payload)


def composed(folder: Path, compression: str, jpeg: bool, *overrides: str):
    layout = ["data.format=image", "data.feature_key=image/encoded", "data.label_key=image/class/label"]
    layout += ["data.feature_shape=[224,224,3]", "data.feature_dtype=uint8"]
    config, _ = compose(
        [
            "data=tfrecord",
            "split=uniform",
            f"data.file_pattern={folder}/*.tfrecord",
            f"data.compression={compression}",
            *(layout if jpeg else ["data.feature_shape=[64]"]),
            "data.num_classes=10",
            *overrides,
        ]
    )
    return config


def time_start(folder: Path, compression: str, jpeg: bool) -> float:
    from bwopt.data.sources import load_source

    config = composed(folder, compression, jpeg)
    started = time.perf_counter()
    load_source(config.data, config.seed, config.split.validation_fraction)
    return time.perf_counter() - started


def time_build(folder: Path, compression: str, skip_bad_records: bool) -> float:
    """Seconds to build the training pipeline of JPEG records with `pipeline.preprocess=imagenet`
    (its random crops need the examples per pass), the source loaded with its counts remembered."""
    from bwopt.data.sources import load_source
    from bwopt.inputs import Inputs, plan

    overrides = [
        "pipeline.preprocess=imagenet",
        "pipeline.vectorized_map=false",
        "train.global_batch_size=4",
        "train.warmup_steps=0",
    ]
    config = composed(folder, compression, True, *overrides, f"data.skip_bad_records={str(skip_bad_records).lower()}")
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    started = time.perf_counter()
    Inputs(config, source, plan(config, source)).dataset(training=True)
    return time.perf_counter() - started


def measure(name: str, folder: Path, compression: str, jpeg: bool) -> None:
    first = time_start(folder, compression, jpeg)
    later = statistics.median(time_start(folder, compression, jpeg) for _ in range(2))
    size = sum(path.stat().st_size for path in folder.iterdir())
    print(
        f"{name:<34} {size / 1e9:6.2f} GB  first run {first:7.2f} s  later runs {later:6.3f} s  "
        f"ratio first/later {first / later:8.1f}",
        flush=True,
    )
    if jpeg:  # the pipeline told the counts, against one that counts by a pass (skip_bad_records)
        time_build(folder, compression, False)  # the first build in a process traces what later ones reuse
        told, counted = time_build(folder, compression, False), time_build(folder, compression, True)
        print(
            f"{'':<34} training pipeline, preprocess=imagenet: built in {told:6.3f} s with the counts told, "
            f"{counted:7.2f} s counting by a pass (skip_bad_records)",
            flush=True,
        )


def main() -> None:
    gigabytes = float(os.environ.get("BWOPT_RECORDS_GB", "2"))
    jpeg_records = int(gigabytes * 1e9 / JPEG_BYTES) // SCALE
    print(f"startup_records: {load_line()}")
    with tempfile.TemporaryDirectory(prefix="bwopt-records-") as root:
        os.environ["XDG_CACHE_HOME"] = str(Path(root) / "cache")  # an empty count cache
        sets = [
            (
                "ImageNet's count, 64 B records",
                "imagenet",
                1024 // min(SCALE, 64),
                IMAGENET_RECORDS // SCALE,
                64,
                "NONE",
            ),
            ("JPEG records (Model Garden layout)", "jpeg", 64, jpeg_records, JPEG_BYTES, "NONE"),
            ("JPEG records, GZIP (1/10)", "jpeg_gzip", 16, max(16, jpeg_records // 10), JPEG_BYTES, "GZIP"),
        ]
        for name, folder, num_files, num_records, record_bytes, compression in sets:
            path = Path(root) / folder
            write_set(path, num_files, num_records, record_bytes, compression)
            measure(name, path, compression, jpeg=record_bytes == JPEG_BYTES)


if __name__ == "__main__":
    main()
