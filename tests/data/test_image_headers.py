"""The decoded size of an image, read from its header, against images Pillow wrote at known sizes."""

import io
import struct

import numpy as np
import pytest
from PIL import Image

from bwopt.data.image_headers import embedded_image_size, image_size
from bwopt.data.records import first_records, masked_crc32c


def encoded(height: int, width: int, image_format: str, **options) -> bytes:
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=image_format, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "image_format,options",
    [
        ("JPEG", {}),
        ("JPEG", {"progressive": True}),
        ("JPEG", {"exif": b"Exif\x00\x00" + bytes(4000)}),  # an APP1 segment before the frame header
        ("PNG", {}),
        ("BMP", {}),
        ("GIF", {}),
    ],
    ids=["baseline", "progressive", "exif", "png", "bmp", "gif"],
)
def test_the_header_gives_the_height_and_width_the_image_was_written_at(image_format, options):
    for height, width in [(37, 91), (300, 20), (1, 1)]:
        assert image_size(encoded(height, width, image_format, **options)) == (height, width)


def test_bytes_that_are_no_image_or_a_cut_header_give_nothing():
    jpeg = encoded(40, 50, "JPEG")
    frame = jpeg.index(b"\xff\xc0")
    assert image_size(b"") is None
    assert image_size(b"not an image at all") is None
    assert image_size(jpeg[: frame + 6]) is None  # cut inside the frame header
    assert image_size(jpeg[:frame]) is None  # cut before it


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def test_the_first_records_of_a_tfrecord_file_give_the_images_inside_them(tmp_path):
    images = [encoded(24 + index, 32, "JPEG") for index in range(5)]
    path = tmp_path / "images.tfrecord"
    # an Example's bytes around the image: a label feature before it, the feature's key after
    path.write_bytes(b"".join(record(b"\n\x0b\n\x05label" + image + b"\x12features") for image in images))
    records = list(first_records(str(path), "NONE", 3))
    assert len(records) == 3
    assert [embedded_image_size(data) for data in records] == [(24, 32), (25, 32), (26, 32)]
    assert len(list(first_records(str(path), "NONE", 64))) == 5
    assert embedded_image_size(b"\n\x05label no image") is None
