"""Bad TFRecord files: each is named, with the record and the config key to check, never a bare traceback."""

import os
from pathlib import Path

import pytest

from bwopt.data.records import DataError, count_records, masked_crc32c

TINY = ["train.epochs=1", "train.warmup_steps=2", "train.steps_per_epoch=4", "measure.memcpy_bandwidth=false"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The digits as 4 uncompressed TFRecord shards (bwopt's own layout): 3 train, 1 validation."""
    from bwopt.data.sources import load_digits
    from bwopt.data.tfrecord import materialise

    digits = load_digits()
    files = materialise(digits.features, digits.labels, tmp_path_factory.mktemp("shards"), 4, "NONE")
    return [Path(path) for path in files.paths]


def copy_shards(shards, folder: Path):
    folder.mkdir()
    for path in shards:
        (folder / path.name).write_bytes(path.read_bytes())
    return sorted(folder.iterdir())


def user_files(folder: Path, *overrides):
    return [
        *TINY,
        "data=tfrecord",
        "split=uniform",
        f"data.file_pattern={folder}/*",
        "data.feature_shape=[8,8,1]",
        "data.num_classes=10",
        *overrides,
    ]


def test_the_checksum_is_tfrecords_own(shards):
    header = shards[0].read_bytes()[:12]
    assert int.from_bytes(header[8:], "little") == masked_crc32c(header[:8])


@pytest.mark.parametrize(
    "damage,compression,message",
    [
        (lambda data: data[: len(data) // 2 + 7], "NONE", "record 225 has no valid TFRecord header"),
        (lambda data: os.urandom(len(data)), "NONE", "record 0 has no valid TFRecord header"),
        (lambda data: data, "GZIP", "cannot be read with data.compression=GZIP"),
        (lambda data: data, "ZLIB", "cannot be read with data.compression=ZLIB"),
    ],
)
def test_a_damaged_or_mis_declared_file_is_named_before_anything_runs(shards, tmp_path, damage, compression, message):
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(damage(shards[0].read_bytes()))
    with pytest.raises(DataError, match=f"{path}: {message}"):
        count_records(str(path), compression)


def test_an_empty_file_or_no_file_is_a_data_error_before_the_run(run_experiment, shards, tmp_path, mlflow_client):
    folder = tmp_path / "files"
    copy_shards(shards, folder)
    (folder / "zz-empty.tfrecord").write_bytes(b"")
    with pytest.raises(DataError, match=r"zz-empty.tfrecord: holds no record"):
        run_experiment(*user_files(folder), experiment="empty_file")
    with pytest.raises(DataError, match=r"data.file_pattern='/nowhere/\*' matches no file"):
        run_experiment(*user_files(Path("/nowhere")), experiment="empty_file")
    assert mlflow_client.get_experiment_by_name("empty_file") is None  # no run records a data mistake


def test_a_flipped_byte_names_the_file_and_record_and_the_run_fails(run_experiment, shards, tmp_path, mlflow_client):
    folder = tmp_path / "files"
    paths = copy_shards(shards, folder)
    data = bytearray(paths[0].read_bytes())
    data[len(data) // 2 + 50] ^= 0xFF  # inside a record's data: only its data CRC can tell
    paths[0].write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"{paths[0]}: record \d+: .*(corrupt|checksum|crc)"):
        run_experiment(*user_files(folder), "train.epochs=2", "train.steps_per_epoch=null", experiment="flipped")
    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("flipped").experiment_id])
    assert run.info.status == "FAILED" and str(paths[0]) in run.data.tags["bwopt.end_reason"]

    # Opt in to skipping: the run finishes and says how many records it lost.
    summary = run_experiment(*user_files(folder), "data.skip_bad_records=true", experiment="flipped_skipped")
    assert summary.status == "FINISHED" and summary.measurements["skipped_records"] > 0


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["data.feature_shape=[8,8,2]"], r"data.feature_shape=\[8, 8, 2\]"),
        (["data.feature_key=pixels"], "data.feature_key='pixels' is missing"),
        (["data.num_classes=5"], r"outside \[0, data.num_classes=5\)"),
    ],
)
def test_records_that_do_not_fit_the_config_name_the_key(run_experiment, shards, tmp_path, overrides, key):
    folder = tmp_path / "files"
    copy_shards(shards, folder)
    with pytest.raises(DataError, match=rf"{folder}/.*: record \d+: .*{key}"):
        run_experiment(*user_files(folder, *overrides), "tracking=none")
