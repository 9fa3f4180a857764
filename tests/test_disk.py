"""Where a run writes: the user's folder and database left alone, and every disk fault one line.

Real processes (`python -m bwopt`), real files and sqlite databases, and a full filesystem made
as a real 256 kB tmpfs (skipped, with the reason, where this machine cannot mount one).
"""

import contextlib
import hashlib
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_bwopt

pytestmark = pytest.mark.slow  # every test starts a process

TINY = ["train.epochs=1", "measure.memcpy_bandwidth=false", "tracking.system_metrics=false"]


def digest(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in folder.rglob("*")
        if path.is_file()
    }


def one_line_refusal(result: subprocess.CompletedProcess, code: int) -> str:
    """The one line a refused run printed (no traceback)."""
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("bwopt:")]
    return line


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str):
    """`folder` as a tmpfs of `size`, unmounted after (skips, with the reason, where none can be mounted)."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here to fill: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 256 kB tmpfs filled to the last byte; unmounted after the test."""
    with small_tmpfs(tmp_path / "full", "256k") as folder:
        with open(folder / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:  # ENOSPC: full
                pass
        yield folder


def test_a_run_folder_holding_the_users_files_is_refused_and_left_as_it_was(tmp_path):
    folder = tmp_path / "mine"
    (folder / "plots").mkdir(parents=True)
    (folder / "config.yaml").write_text("my: settings\n")
    (folder / "summary.json").write_text('{"mine": true}\n')
    (folder / "plots" / "loss.png").write_bytes(b"\x89PNG mine")
    before = digest(folder)
    line = one_line_refusal(run_bwopt(f"hydra.run.dir={folder}", *TINY, cwd=tmp_path), 2)
    assert f"hydra.run.dir={folder} already holds files no run wrote (config.yaml, plots, summary.json)" in line
    assert digest(folder) == before and not (folder / ".hydra").exists()
    assert not (tmp_path / "outputs").exists()  # nothing else made either: no store, no run
    # The same folder named in a preset of one's own config folder, not on the command line.
    presets = tmp_path / "my_conf" / "experiment"
    presets.mkdir(parents=True)
    (presets / "mine.yaml").write_text(f"# @package _global_\nhydra:\n  run:\n    dir: {folder}\n")
    result = run_bwopt("--config-dir", str(tmp_path / "my_conf"), "experiment=mine", *TINY, cwd=tmp_path)
    assert "already holds files no run wrote" in one_line_refusal(result, 2)
    assert digest(folder) == before and not (tmp_path / "outputs").exists()


def test_a_sweep_folder_holding_the_users_files_is_refused_and_left_as_it_was(tmp_path):
    folder = tmp_path / "mine"
    (folder / "0").mkdir(parents=True)
    (folder / "0" / "notes.txt").write_text("mine\n")  # Hydra's job 0 would write into it
    before = digest(folder)
    line = one_line_refusal(
        run_bwopt("-m", f"hydra.sweep.dir={folder}", "pipeline.prefetch=0,1", *TINY, cwd=tmp_path), 2
    )
    assert f"hydra.sweep.dir={folder} already holds files no sweep wrote (0), which the sweep would overwrite" in line
    assert digest(folder) == before and not (tmp_path / "outputs").exists()


def test_folders_a_run_or_a_sweep_wrote_may_be_written_again(tmp_path):
    from bwopt.app import unwritable_run_folder

    run, sweep, tune = tmp_path / "run", tmp_path / "sweep", tmp_path / "tune"
    (run / ".hydra").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (sweep / "0").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("")
    (tune / "0" / ".hydra").mkdir(parents=True)  # bwopt's own sweepers write no multirun.yaml
    assert unwritable_run_folder([f"hydra.run.dir={run}", f"hydra.sweep.dir={sweep}"]) is None
    assert unwritable_run_folder([f"hydra.sweep.dir={tune}", f"hydra.sweep.dir={tmp_path / 'new'}"]) is None
    assert "no run wrote" in unwritable_run_folder([f"hydra.run.dir={sweep}"])  # a sweep folder is not a run's


def test_a_users_sqlite_database_is_refused_as_a_store_and_left_byte_identical(tmp_path):
    database = tmp_path / "x.db"
    with sqlite3.connect(database) as connection:
        connection.execute("create table people (name text)")
        connection.execute("insert into people values ('ada')")
    before = database.read_bytes()
    result = run_bwopt(f"tracking.uri=sqlite:///{database}", f"hydra.run.dir={tmp_path / 'run'}", *TINY, cwd=tmp_path)
    line = one_line_refusal(result, 3)
    assert f"tracking.uri=sqlite:///{database}: {database} is an SQLite database but not an MLflow store" in line
    assert database.read_bytes() == before and not list(tmp_path.glob("x.db-*"))


@pytest.mark.parametrize(
    "key,path,cause",
    [
        ("pipeline.cache_path", "a_file/cache", "a_file is a file, not a folder"),
        ("pipeline.snapshot.path", "a_file", "a_file is a file, not a folder"),
        ("pipeline.tfrecord.directory", "/proc/bwopt-shards", "the folder cannot be made (No such file or directory)"),
        ("pipeline.cache_path", "/proc/bwopt-cache/train", "the folder cannot be made (No such file or directory)"),
    ],
)
def test_pipeline_files_that_cannot_be_written_are_one_line_before_the_run(tmp_path, key, path, cause):
    (tmp_path / "a_file").write_text("mine\n")
    extra = {
        "pipeline.cache_path": ["pipeline.cache=file"],
        "pipeline.tfrecord.directory": ["pipeline.tfrecord.enabled=true"],
    }.get(key, [])
    result = run_bwopt(*extra, f"{key}={path}", f"hydra.run.dir={tmp_path / 'run'}", *TINY, cwd=tmp_path)
    assert one_line_refusal(result, 2).startswith(f"bwopt: invalid config: {key}={path}: ")
    assert cause in result.stderr
    assert (tmp_path / "a_file").read_text() == "mine\n" and not (tmp_path / "outputs" / "mlflow.db").exists()


def test_a_store_in_a_folder_that_cannot_be_made_is_one_line_with_code_3(tmp_path):
    result = run_bwopt(
        "tracking.uri=sqlite:////proc/bwopt/mlflow.db", f"hydra.run.dir={tmp_path / 'run'}", *TINY, cwd=tmp_path
    )
    assert "the folder /proc/bwopt cannot be made (No such file or directory)" in one_line_refusal(result, 3)


def test_a_full_disk_is_one_line_naming_the_key_the_path_and_the_room_left(tmp_path, full_disk):
    run = [f"hydra.run.dir={tmp_path / 'run'}", *TINY]
    result = run_bwopt(f"hydra.run.dir={full_disk / 'run'}", *TINY[1:], cwd=tmp_path)
    assert f"hydra.run.dir={full_disk / 'run'}: no space left: 0 bytes free" in one_line_refusal(result, 2)
    result = run_bwopt("pipeline.cache=file", f"pipeline.cache_path={full_disk / 'cache'}", *run, cwd=tmp_path)
    line = one_line_refusal(result, 2)
    assert f"pipeline.cache_path={full_disk / 'cache'}: no space left: 0 bytes free on {full_disk}" in line
    assert "this needs ~373.9 kB" in line  # 1,438 training digits of 64 float32 values and a label
    result = run_bwopt(f"tracking.uri=sqlite:///{full_disk / 'store' / 'mlflow.db'}", *run, cwd=tmp_path)
    assert "no space left: 0 bytes free" in one_line_refusal(result, 3)  # the store's folder made, then removed
    assert sorted(path.name for path in full_disk.iterdir()) == ["filler"]  # no partial cache, store or run folder


def test_a_disk_that_fills_during_the_run_is_one_line_and_the_run_keeps_its_figures(tmp_path):
    from mlflow import MlflowClient

    store = tmp_path / "mlflow.db"
    with small_tmpfs(tmp_path / "small", "1m") as small:
        fills = [
            "model=custom",
            "model._target_=models_fixture.mymodels.fills_the_disk",
            f"+model.kwargs.path={small / 'filler'}",
        ]
        result = run_bwopt(
            *fills,
            f"hydra.run.dir={small / 'run'}",
            f"tracking.uri=sqlite:///{store}",
            *TINY,
            cwd=tmp_path,
            env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
        )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    # a plot that could not be saved is a warning; the error is the one line that ends the run
    errors = [line for line in result.stderr.splitlines() if line.startswith("bwopt:") and "warning" not in line]
    (line,) = errors
    assert line.startswith("bwopt: the disk filled during the run") and "(No space left on device)" in line
    assert "keeps what was measured" in line
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("bwopt").experiment_id])
    assert run.info.status == "FAILED" and "No space left on device" in run.data.tags["bwopt.end_reason"]
    assert run.data.metrics["throughput_examples_per_s"] > 0 and "val_accuracy" in run.data.metrics
