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


def test_a_pattern_that_names_a_folder_or_one_file_is_a_data_error_naming_the_key(shards, tmp_path):
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.data.sources import load_source

    def load(pattern):
        overrides = [item for item in user_files(tmp_path) if not item.startswith("data.file_pattern=")]
        config = validate(compose_config([*overrides, f"data.file_pattern={pattern}"]))
        return load_source(config.data, config.seed, config.split.validation_fraction)

    folder = tmp_path / "files"
    copy_shards(shards, folder)
    with pytest.raises(DataError, match=f"^{folder}: is a folder, not a data file; make data.file_pattern match"):
        load(str(folder))
    with pytest.raises(DataError, match=r"data.file_pattern='.*shard-0.*' matches 1 file, and holding out"):
        load(str(sorted(folder.iterdir())[0]))


@pytest.mark.slow
def test_an_empty_file_or_no_file_is_a_data_error_before_the_run(run_experiment, shards, tmp_path, mlflow_client):
    folder = tmp_path / "files"
    copy_shards(shards, folder)
    (folder / "zz-empty.tfrecord").write_bytes(b"")
    with pytest.raises(DataError, match=r"zz-empty.tfrecord: holds no record"):
        run_experiment(*user_files(folder), experiment="empty_file")
    with pytest.raises(DataError, match=r"data.file_pattern='/nowhere/\*' matches no file"):
        run_experiment(*user_files(Path("/nowhere")), experiment="empty_file")
    assert mlflow_client.get_experiment_by_name("empty_file") is None  # no run records a data mistake


@pytest.mark.slow  # trains for seconds
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
@pytest.mark.slow
def test_records_that_do_not_fit_the_config_name_the_key(run_experiment, shards, tmp_path, overrides, key):
    folder = tmp_path / "files"
    copy_shards(shards, folder)
    with pytest.raises(DataError, match=rf"{folder}/.*: record \d+: .*{key}"):
        run_experiment(*user_files(folder, *overrides), "tracking=none")


@pytest.fixture
def count_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "bwopt" / "record-counts"


def test_a_file_is_counted_once_then_remembered_until_it_changes(shards, tmp_path, count_cache):
    path = tmp_path / "shard.tfrecord"
    data = shards[0].read_bytes()
    path.write_bytes(data)
    first = count_records(str(path))
    assert first > 0 and len(list(count_cache.iterdir())) == 1
    # Same size and modification time, other bytes: the remembered count is used, the file not read.
    status = path.stat()
    path.write_bytes(os.urandom(len(data)))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert count_records(str(path)) == first
    # A file that changes is read (and checked) again.
    path.write_bytes(data + data)
    assert count_records(str(path)) == 2 * first


def test_zlib_files_are_counted_as_a_stream(shards, tmp_path, count_cache):
    import zlib

    path = tmp_path / "shard.zlib"
    data = shards[0].read_bytes()
    path.write_bytes(zlib.compress(data * 3))
    assert count_records(str(path), "ZLIB") == 3 * count_records(str(shards[0]))
    truncated = tmp_path / "truncated.zlib"
    truncated.write_bytes(zlib.compress(data)[:-40])
    with pytest.raises(DataError, match="cannot be read with data.compression=ZLIB"):
        count_records(str(truncated), "ZLIB")


def test_what_is_not_a_regular_file_is_refused_without_opening_it(tmp_path, count_cache):
    fifo = tmp_path / "pipe.tfrecord"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes
    with pytest.raises(DataError, match="is a named pipe, not a data file"):
        count_records(str(fifo))
    with pytest.raises(DataError, match="is a folder, not a data file"):
        count_records(str(tmp_path))
    loop = tmp_path / "loop.tfrecord"
    loop.symlink_to(loop)
    with pytest.raises(DataError, match="cannot be read"):
        count_records(str(loop))
    with pytest.raises(DataError, match="not a data file"):
        count_records("/dev/null")  # a character device


def test_validation_files_that_are_training_files_are_warned_about(shards, tmp_path, count_cache, capsys):
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.data.sources import load_tfrecord

    folder = tmp_path / "files"
    copy_shards(shards, folder)
    (tmp_path / "alias").symlink_to(folder)  # the same files by another path
    held_out = [item.replace(f"{folder}/*", f"'{folder}/*-0000[012]-*'") for item in user_files(folder)]
    config = validate(compose_config([*held_out, f"data.validation_file_pattern={folder}/*-00003-*"]))
    load_tfrecord(config.data, config.seed, config.split.validation_fraction)
    assert "warning" not in capsys.readouterr().err
    shared = user_files(folder, f"data.validation_file_pattern={tmp_path / 'alias'}/*")
    config = validate(compose_config(shared))
    load_tfrecord(config.data, config.seed, config.split.validation_fraction)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("bwopt: warning: data.validation_file_pattern matches 4 of the training files")
    assert "not on held-out data" in line
