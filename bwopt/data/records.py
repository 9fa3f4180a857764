"""The TFRecord container format read without TensorFlow, to count records before a run.

Counting also checks every record's frame: its length field's CRC (CRC-32C, masked as TFRecord
masks it) and that the record is whole, so a truncated, random or wrongly-compressed file is
named, with the record index, before anything trains. The records' data CRCs are left to
TensorFlow's reader, which checks them as it reads (bwopt then names the file, bwopt.data.diagnose).

A file is counted once: its count is remembered under bwopt's cache folder, keyed by the file's
real path, size, modification time and compression, so a run over a large data set starts
without reading it again; a file that changes is counted (and checked) anew. Only regular files
are read: a named pipe, a device or a folder matching the pattern is refused up front (opening a
pipe would block until someone writes to it).
"""

import gzip
import hashlib
import json
import os
import stat
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Iterator, Optional


class DataError(ValueError):
    """A data file cannot be used as configured: the message names the file and the key to check."""


def _crc32c_table() -> list:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 bits plus a constant."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def open_records(path: str, compression: str):
    """A binary stream of the uncompressed record data."""
    try:
        opener = OPENERS[compression]
    except KeyError:
        raise ValueError(f"compression={compression!r}; expected one of: {', '.join(OPENERS)}") from None
    return opener(path)


class _ZlibReader:
    """A ZLIB-compressed file read as a stream, a chunk at a time (never whole into memory)."""

    CHUNK_BYTES = 1 << 20

    def __init__(self, path: str) -> None:
        self.file = open(path, "rb")
        self.decompressor = zlib.decompressobj()
        self.buffer = b""

    def read(self, size: int) -> bytes:
        while len(self.buffer) < size and not self.decompressor.eof:
            chunk = self.file.read(self.CHUNK_BYTES)
            if not chunk:
                if not self.decompressor.eof:
                    raise zlib.error("the compressed stream ends early")
                break
            self.buffer += self.decompressor.decompress(chunk)
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def check_regular_file(path: str) -> os.stat_result:
    """The file's status; a DataError when it is not a regular file (or cannot be reached)."""
    try:
        status = os.stat(path)
    except OSError as error:  # a dangling link, a symlink loop, no permission
        raise DataError(f"{path}: cannot be read ({error.strerror}); check the file and data.file_pattern") from None
    if not stat.S_ISREG(status.st_mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(status.st_mode)
            else "a named pipe"
            if stat.S_ISFIFO(status.st_mode)
            else "not a regular file"
        )
        raise DataError(f"{path}: is {kind}, not a data file; make data.file_pattern match files only")
    return status


def count_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bwopt" / "record-counts"


def _count_key(path: str, status: os.stat_result, compression: str) -> str:
    identity = json.dumps([os.path.realpath(path), status.st_size, status.st_mtime_ns, compression])
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def remembered_count(path: str, status: os.stat_result, compression: str) -> Optional[int]:
    try:
        return int((count_cache_dir() / _count_key(path, status, compression)).read_text())
    except (OSError, ValueError):
        return None


def remember_count(path: str, status: os.stat_result, compression: str, count: int) -> None:
    """Written atomically; a cache that cannot be written only costs the next run a recount."""
    folder = count_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as file:
            file.write(str(count))
        os.replace(file.name, folder / _count_key(path, status, compression))
    except OSError:
        pass


def count_records(path: str, compression: str = "NONE") -> int:
    """Records in one TFRecord file, remembered once counted (see the module docstring).

    Raises:
        DataError: naming the file, the record and `data.compression`, when the file is not a whole
            TFRecord file with that compression (truncated, random bytes, another compression), or
            not a regular file.
    """
    status = check_regular_file(path)
    count = remembered_count(path, status, compression)
    if count is None:
        count = read_and_count(path, compression, status.st_size)
        remember_count(path, status, compression, count)
    return count


def first_records(path: str, compression: str, count: int) -> Iterator[bytes]:
    """The data of the first `count` records of a TFRecord file (each a uint64 length, its CRC, the
    data and a CRC), fewer where the file ends or breaks off."""
    with open_records(path, compression) as stream:
        for _ in range(count):
            header = stream.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = stream.read(length)
            if len(data) < length:
                return
            yield data
            stream.read(4)


def read_and_count(path: str, compression: str, file_size: int) -> int:
    """Records in one TFRecord file, read: each is a uint64 length, its masked CRC, the data and a CRC."""
    count = 0
    size = file_size if compression == "NONE" else None
    try:
        with open_records(path, compression) as stream:
            while True:
                header = stream.read(12)
                if not header:
                    return count
                (length,) = struct.unpack("<Q", header[:8]) if len(header) == 12 else (None,)
                if length is None or struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
                    raise DataError(
                        f"{path}: record {count} has no valid TFRecord header (truncated, damaged, or not "
                        f"a TFRecord file with data.compression={compression}); check the file and data.compression"
                    )
                if size is not None:
                    stream.seek(length + 4, 1)
                    whole = stream.tell() <= size
                else:
                    whole = len(stream.read(length + 4)) == length + 4
                if not whole:
                    raise DataError(f"{path}: record {count} is cut short: the file is truncated")
                count += 1
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise DataError(
            f"{path}: cannot be read with data.compression={compression} ({error}); check data.compression"
        ) from None


# Keyed by bwopt.schema.TFRECORD_COMPRESSIONS.
OPENERS = {
    "NONE": lambda path: open(path, "rb"),
    "GZIP": lambda path: gzip.open(path, "rb"),
    "ZLIB": _ZlibReader,
}
