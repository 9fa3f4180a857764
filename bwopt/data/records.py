"""The TFRecord container format read without TensorFlow, to count records before a run."""

import gzip
import struct
import zlib
from pathlib import Path


def open_records(path: str, compression: str):
    """A binary stream of the uncompressed record data."""
    try:
        opener = OPENERS[compression]
    except KeyError:
        raise ValueError(f"compression={compression!r}; expected one of: {', '.join(OPENERS)}") from None
    return opener(path)


class _ZlibReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.position = zlib.decompress(data), 0

    def read(self, size: int) -> bytes:
        chunk = self.data[self.position : self.position + size]
        self.position += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = 0) -> None:
        self.position += offset

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def count_records(path: str, compression: str = "NONE") -> int:
    """Records in one TFRecord file: each is a uint64 length, a CRC, the data and a CRC."""
    count = 0
    with open_records(path, compression) as stream:
        while True:
            header = stream.read(12)
            if not header:
                return count
            if len(header) < 12:
                raise ValueError(f"{path}: truncated TFRecord header after {count} records")
            (length,) = struct.unpack("<Q", header[:8])
            stream.seek(length + 4, 1)
            count += 1


# Keyed by bwopt.schema.TFRECORD_COMPRESSIONS.
OPENERS = {
    "NONE": lambda path: open(path, "rb"),
    "GZIP": lambda path: gzip.open(path, "rb"),
    "ZLIB": lambda path: _ZlibReader(Path(path).read_bytes()),
}
