"""The TFRecord container format read without TensorFlow, to count records before a run.

Counting also checks every record's frame: its length field's CRC (CRC-32C, masked as TFRecord
masks it) and that the record is whole, so a truncated, random or wrongly-compressed file is
named, with the record index, before anything trains. The records' data CRCs are left to
TensorFlow's reader, which checks them as it reads (bwopt then names the file, `Run.diagnose`).
"""

import gzip
import os
import struct
import zlib
from pathlib import Path


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
    """Records in one TFRecord file: each is a uint64 length, its masked CRC, the data and a CRC.

    Raises:
        DataError: naming the file, the record and `data.compression`, when the file is not a whole
            TFRecord file with that compression (truncated, random bytes, another compression).
    """
    count = 0
    size = os.path.getsize(path) if compression == "NONE" else None
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
    "ZLIB": lambda path: _ZlibReader(Path(path).read_bytes()),
}
