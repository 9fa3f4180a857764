"""How many pixels an encoded image decodes to, read from its header: no decoding, no TensorFlow.

For the memory an image pipeline's buffers need before anything runs (bwopt.memory): a cache of
decoded images holds height × width × 3 bytes per image, which the file's size does not tell.
JPEG (the frame header, SOF0-SOF15 but the DHT/JPG/DAC markers), PNG (IHDR), BMP and GIF (the
logical screen) are read; anything else is None.
"""

import struct
from typing import Optional, Tuple

JPEG_START = b"\xff\xd8\xff"
PNG_START = b"\x89PNG\r\n\x1a\n"
# Markers in 0xC0-0xCF that are not frame headers: DHT, JPG, DAC.
NOT_FRAMES = {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-7, SOI, EOI.
STANDALONE = {0x01, *range(0xD0, 0xDA)}


def image_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) of the image `data` starts with; None when its header cannot be read."""
    if data.startswith(JPEG_START):
        return jpeg_size(data)
    if data.startswith(PNG_START) and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    if data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return abs(height), width
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return height, width
    return None


def jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) from a JPEG's frame header, walking the marker segments after SOI."""
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in STANDALONE:
            position += 2
            continue
        (length,) = struct.unpack(">H", data[position + 2 : position + 4])
        if 0xC0 <= marker <= 0xCF and marker not in NOT_FRAMES:
            if position + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[position + 5 : position + 9])
            return height, width
        position += 2 + length
    return None


def embedded_image_size(record: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) of the first JPEG or PNG inside `record` (a serialised tf.train.Example holds
    the encoded image as one of its byte strings); None when none is found."""
    for start in (JPEG_START, PNG_START):
        at = record.find(start)
        size = image_size(record[at:]) if at >= 0 else None
        if size:
            return size
    return None
