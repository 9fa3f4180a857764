"""Where a run writes, checked before it runs, and the file cache keyed by what it holds.

Each folder bwopt writes into (the run folder, `pipeline.cache_path`'s folder, `pipeline.snapshot.path`,
`pipeline.tfrecord.directory`) is made here first, so that a parent that is a file, a folder that
cannot be made or a full filesystem is one line naming the key, the path and the cause (exit 2),
instead of TensorFlow's traceback in the middle of the run. No TensorFlow here.

tf.data's file cache (`Dataset.cache(prefix)`) reads whatever a complete cache at its prefix holds,
whatever made it: `cache_prefix` names the cache by a hash of the content and the settings that
shape its elements, as the TFRecord shards are named, and `remove_partial_cache` clears what an
interrupted writer left (tf.data would otherwise refuse the prefix as "in use" for ever).
"""

import errno
import glob
import hashlib
import json
import os
from pathlib import Path
from typing import List, Optional

from bwopt.schema.checks import ConfigError

# A run's own files (config, summary, plots, checkpoint) need at least this much room.
RUN_FOLDER_MIN_BYTES = 1 << 20


def readable_bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{int(count)} bytes"


def nearest_existing(path: Path) -> Path:
    return next((folder for folder in (path, *path.parents) if folder.exists()), Path("."))


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem that holds `path`."""
    stats = os.statvfs(nearest_existing(Path(path).absolute()))
    return stats.f_bavail * stats.f_frsize


def missing_folders(folder: Path) -> List[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    return [parent for parent in (folder, *folder.parents) if not parent.exists()]


def remove_folders(made: List[Path]) -> None:
    """Remove the folders `missing_folders` named and a check then made (deepest first): a refused
    run leaves a full disk as it was."""
    for parent in made:
        if parent.is_dir():
            parent.rmdir()


def make_folder(key: str, folder: Path, needed_bytes: int = 0, value: Optional[str] = None) -> None:
    """Make `folder` (and its parents), or raise ConfigError naming `key`, the path and the cause.

    `needed_bytes`: what will be written there, checked against the room left.
    """
    shown = f"{key}={value if value is not None else folder}"
    blocker = nearest_existing(folder)
    if not blocker.is_dir():
        raise ConfigError(f"{shown}: {blocker} is a file, not a folder; give a folder path")
    made = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise ConfigError(
                f"{shown}: the folder cannot be made ({error.strerror}); give a writable folder"
            ) from None
    free = free_bytes(folder)
    if needed_bytes and free < needed_bytes:
        remove_folders(made)
        raise ConfigError(
            f"{shown}: no space left: {readable_bytes(free)} free on {blocker}, and this needs "
            f"~{readable_bytes(needed_bytes)}; free some space or point {key} elsewhere"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{shown}: {folder} is not writable; give a writable folder")


def check_output_paths(config, num_examples: int, bytes_per_example: int) -> None:
    """The pipeline's files (cache, snapshot, TFRecord shards) can be written where the config says.

    Sizes are the uncompressed elements' (`num_examples` x `bytes_per_example`); a compressed
    snapshot or TFRecord only needs some room up front, and a full disk later fails the run.
    """
    pipeline = config.pipeline
    needed = num_examples * bytes_per_example
    if pipeline.cache == "file":
        path = Path(pipeline.cache_path)
        if path.is_dir():
            raise ConfigError(
                f"pipeline.cache_path={pipeline.cache_path}: is a folder; give a file prefix inside it, "
                f"e.g. {path / 'cache'}"
            )
        make_folder("pipeline.cache_path", path.parent, needed, pipeline.cache_path)
    if pipeline.snapshot.path:
        compressed = pipeline.snapshot.compression != "NONE"
        size = RUN_FOLDER_MIN_BYTES if compressed else needed
        make_folder("pipeline.snapshot.path", Path(pipeline.snapshot.path), size)
    if pipeline.tfrecord.enabled:
        compressed = pipeline.tfrecord.compression != "NONE"
        size = RUN_FOLDER_MIN_BYTES if compressed else needed * 5 // 4  # the examples' framing
        make_folder("pipeline.tfrecord.directory", Path(pipeline.tfrecord.directory), size)


def cache_prefix(cache_path: str, identity: dict) -> str:
    """`cache_path` with a key: the first 16 hex digits of a sha256 over `identity` (JSON), the
    content and settings that decide what the cached elements hold."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    return f"{cache_path}-{digest[:16]}"


def remove_partial_cache(prefix: str) -> bool:
    """Remove what an interrupted tf.data cache writer left at `prefix` (its lockfile, temporary
    state): a complete cache has its `.index`. Returns whether anything was removed."""
    if os.path.exists(f"{prefix}.index"):
        return False
    leftovers = glob.glob(glob.escape(prefix) + "_*") + glob.glob(glob.escape(prefix) + ".data-*")
    for leftover in leftovers:
        os.remove(leftover)
    return bool(leftovers)


def disk_full(error: BaseException) -> Optional[OSError]:
    """The OSError for a full disk (or quota) behind `error`, following its causes; else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None
