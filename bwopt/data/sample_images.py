"""data=sample_images: a real JPEG folder made once, without download, from a photograph that ships
with scikit-learn (china.jpg, 427x640: a file that `sklearn.datasets.load_sample_images` reads,
read here with PIL directly, since importing sklearn.datasets costs seconds).

Image i is a random crop of the photograph (MIN_CROP_AREA_FRACTION of its area or more, aspect
3:4 to 4:3), scaled so that its longer side is `saved_side_px` [low, high] pixels, turned and
saved as a JPEG in the folder of its turn, the class (i mod 3, so the classes are balanced):

    upright      as photographed (sky above, trees below)
    upside_down  turned by 180 degrees
    sideways     turned by 90 or 270 degrees (either, at random)

A horizontal flip (the imagenet preprocessing's) keeps every class: it mirrors an upright or an
upside-down image in place, and turns a 90-degree image into a mirrored 270-degree one, which is
why those two are one class. The other sample photograph (flower.jpg, a dahlia seen from above)
is not used: it has no up, so its rotations could not be told apart. PIL writes the files; no
TensorFlow is needed.

The folder is named by a hash of the generator settings and the photograph's file, under
`data.directory`, and written like bwopt's TFRecord cache (bwopt.data.tfrecord): into a hidden
staging folder renamed into place, so an interrupted write never leaves a partial folder and
a second run reuses the files untouched.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import List

import numpy as np

from bwopt.data.images import ImageFileSource, list_image_folder

MANIFEST = "manifest.json"
# Bump when the images made from the same settings change, so old folders are not reused.
FORMAT_VERSION = 2
# Each class with the counter-clockwise quarter turns its images get (one of them, at random).
QUARTER_TURNS = {"upright": (0,), "upside_down": (2,), "sideways": (1, 3)}
CLASS_NAMES = tuple(sorted(QUARTER_TURNS))  # the order data=images gives the class folders
PHOTOGRAPHS = ("china.jpg",)
MIN_CROP_AREA_FRACTION = 0.3


def generator_settings(config) -> dict:
    """Everything that decides the files' content (the decode size `image_size` does not)."""
    return {
        "format_version": FORMAT_VERSION,
        "num_images": config.num_images,
        "saved_side_px": list(config.saved_side_px),
        "jpeg_quality": config.jpeg_quality,
        "generator_seed": config.generator_seed,
    }


def photograph_files() -> List[Path]:
    """scikit-learn's sample photograph(s) used, found without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    folder = Path(spec.submodule_search_locations[0]) / "datasets" / "images"
    return [folder / name for name in PHOTOGRAPHS]


def content_key(settings: dict, files: List[Path]) -> str:
    """First 16 hex digits of a sha256 over the settings and the photographs' files."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def make_sample_images(config) -> Path:
    """The folder of sample JPEGs for `config` (data=sample_images), written on the first call only."""
    from PIL import Image

    settings, files = generator_settings(config), photograph_files()
    root = Path(config.directory)
    folder = root / content_key(settings, files)
    if not (folder / MANIFEST).exists():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            photos = [np.asarray(Image.open(path).convert("RGB")) for path in files]
            write_images(photos, settings, staging)
            rename_into_place(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
    return folder


def write_images(photos: List[np.ndarray], settings: dict, folder: Path) -> None:
    """The JPEG files, one folder per class (QUARTER_TURNS), and the manifest last."""
    from PIL import Image

    rng = np.random.default_rng(settings["generator_seed"])
    low, high = settings["saved_side_px"]
    for name in CLASS_NAMES:
        (folder / name).mkdir()
    for index in range(settings["num_images"]):
        class_name = CLASS_NAMES[index % len(CLASS_NAMES)]
        crop = random_crop(photos[rng.integers(len(photos))], rng)
        image = Image.fromarray(crop)
        scale = int(rng.integers(low, high + 1)) / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)
        turns = int(rng.choice(QUARTER_TURNS[class_name]))
        turned = Image.fromarray(np.rot90(np.asarray(image), k=turns))  # counter-clockwise
        turned.save(folder / class_name / f"{index:05d}.jpg", quality=settings["jpeg_quality"])
    manifest = {**settings, "class_names": list(CLASS_NAMES), "photographs": [list(p.shape) for p in photos]}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def random_crop(photo: np.ndarray, rng) -> np.ndarray:
    """A window of at least MIN_CROP_AREA_FRACTION of the photo's area, aspect ratio 3:4 to 4:3."""
    height, width = photo.shape[:2]
    area = rng.uniform(MIN_CROP_AREA_FRACTION, 1.0) * height * width
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    crop_height = min(height, max(1, round(np.sqrt(area / aspect))))
    crop_width = min(width, max(1, round(np.sqrt(area * aspect))))
    top = int(rng.integers(0, height - crop_height + 1))
    left = int(rng.integers(0, width - crop_width + 1))
    return photo[top : top + crop_height, left : left + crop_width]


def rename_into_place(staging: Path, folder: Path) -> None:
    """Atomic on one file system; a concurrent writer that got there first wins and is reused."""
    try:
        os.rename(staging, folder)
    except OSError:
        if not (folder / MANIFEST).exists():
            raise


def load_sample_images(config, seed: int, validation_fraction: float) -> ImageFileSource:
    """data=sample_images: the folder made (once) for the config, listed like data=images."""
    paths, labels, class_names = list_image_folder(str(make_sample_images(config)))
    return ImageFileSource(np.asarray(paths), labels, class_names, tuple(config.image_size))
