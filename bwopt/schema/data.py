"""Schemas of conf/data/ and conf/split/."""

from dataclasses import dataclass, field
from typing import Any, Dict, List

from omegaconf import MISSING

from bwopt.schema.checks import TFRECORD_COMPRESSIONS, ConfigError, check_at_least, check_choice, check_fraction
from bwopt.schema.targets import check_target

# Image files listed by extension, in any case (image_dataset_from_directory's formats).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# What a TFRecord's feature holds: raw: the array's bytes; image: an encoded image (Model Garden's layout).
TFRECORD_FORMATS = ("raw", "image")

# --- data -------------------------------------------------------------------


@dataclass
class DataConfig:
    name: str = MISSING


@dataclass
class DigitsData(DataConfig):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes)."""

    name: str = "digits"


@dataclass
class SyntheticData(DataConfig):
    """Random images with a learnable class signal, sized to stress memory bandwidth."""

    name: str = "synthetic"
    num_examples: int = 2048
    image_shape: List[int] = field(default_factory=lambda: [32, 32, 3])
    dtype: str = "uint8"
    num_classes: int = 10
    # Strength of the class-dependent mean shift (in units of the noise's spread).
    signal: float = 1.0

    def __post_init__(self) -> None:
        check_at_least("data.num_examples", self.num_examples, 2)
        check_at_least("data.num_classes", self.num_classes, 2)
        check_choice("data.dtype", self.dtype, ("uint8", "float32"))
        if not self.image_shape or min(self.image_shape) < 1:
            raise ConfigError(
                f"data.image_shape={self.image_shape!r} is invalid; expected positive sizes, e.g. [32, 32, 3]"
            )


@dataclass
class ArtificialData(DataConfig):
    """Files with known latencies, like the tf.data performance guide's ArtificialDataset.

    Opening a file sleeps `file_open_latency_s`, reading each element sleeps
    `element_latency_s`, and each train step sleeps `step_compute_s` on top of the model:
    a workload whose input and compute times are known, to check the measurements.
    """

    name: str = "artificial"
    num_files: int = 4
    examples_per_file: int = 64
    file_open_latency_s: float = 0.0
    element_latency_s: float = 0.001
    step_compute_s: float = 0.0
    feature_shape: List[int] = field(default_factory=lambda: [8])
    num_classes: int = 2

    def __post_init__(self) -> None:
        check_at_least("data.num_files", self.num_files, 2)
        check_at_least("data.examples_per_file", self.examples_per_file, 1)
        for key in ("file_open_latency_s", "element_latency_s", "step_compute_s"):
            check_at_least(f"data.{key}", getattr(self, key), 0.0)
        check_at_least("data.num_classes", self.num_classes, 2)


@dataclass
class TFRecordData(DataConfig):
    """The user's TFRecord files: a raw-bytes feature and an int64 label per tf.train.Example."""

    name: str = "tfrecord"
    # Glob of the training files, and of the validation files ('' holds out files by split).
    file_pattern: str = MISSING
    validation_file_pattern: str = ""
    compression: str = "NONE"
    feature_key: str = "features"
    feature_dtype: str = "uint8"
    feature_shape: List[int] = MISSING
    label_key: str = "label"
    num_classes: int = MISSING
    # Device-side multiplier after the cast, e.g. 1/255 for 8-bit images.
    feature_scale: float = 1.0
    # Drop records that do not parse (a damaged file ends at its first damaged record) instead of
    # failing; the run logs how many were skipped (skipped_records).
    skip_bad_records: bool = False
    # raw: the feature is the array's bytes; image: an encoded image (JPEG, PNG...) that the
    # pipeline decodes and resizes to feature_shape [height, width, 3] (TF Model Garden's ImageNet
    # layout: feature_key=image/encoded, label_key=image/class/label).
    format: str = "raw"

    def __post_init__(self) -> None:
        check_choice("data.compression", self.compression, TFRECORD_COMPRESSIONS)
        check_choice("data.feature_dtype", self.feature_dtype, ("uint8", "int32", "int64", "float16", "float32"))
        check_at_least("data.num_classes", self.num_classes, 2)
        check_choice("data.format", self.format, TFRECORD_FORMATS)
        if self.format == "image":
            shape = list(self.feature_shape)
            if len(shape) != 3 or shape[2] != 3 or min(shape) < 1:
                raise ConfigError(
                    f"data.feature_shape={shape} with data.format=image: expected [height, width, 3], the size "
                    "every image is decoded and resized to, e.g. [224, 224, 3]"
                )
            if self.feature_dtype != "uint8":
                raise ConfigError(
                    f"data.feature_dtype={self.feature_dtype} with data.format=image: decoded images are uint8; "
                    "set data.feature_dtype=uint8"
                )


def check_image_size(key: str, size: List[int]) -> None:
    if len(size) != 2 or min(size) < 1:
        raise ConfigError(f"{key}={list(size)!r} is invalid; expected [height, width] in pixels, e.g. [224, 224]")


@dataclass
class ImagesData(DataConfig):
    """Your image files in image_dataset_from_directory's layout: one folder per class under
    `directory` (labels in sorted order of the folder names), files by extension (IMAGE_EXTENSIONS).
    Split by file; the pipeline reads, decodes and resizes each image to `image_size`."""

    name: str = "images"
    directory: str = MISSING
    # [height, width] every image is decoded and resized to (3 channels, uint8).
    image_size: List[int] = field(default_factory=lambda: [224, 224])

    def __post_init__(self) -> None:
        check_image_size("data.image_size", self.image_size)


@dataclass
class SampleImagesData(DataConfig):
    """A real JPEG folder that bwopt makes once, without download, from one of scikit-learn's sample
    photographs (china.jpg): random crops and scales, turned upright, upside down or sideways (a
    quarter turn either way), the orientation being the class (3 classes). Read like data=images."""

    name: str = "sample_images"
    num_images: int = 1000
    image_size: List[int] = field(default_factory=lambda: [64, 64])
    # The longer side of each saved JPEG, drawn uniformly from [low, high] pixels.
    saved_side_px: List[int] = field(default_factory=lambda: [160, 256])
    jpeg_quality: int = 90
    generator_seed: int = 0
    # Cache root: the images go to directory/<hash of the settings above>/, written once.
    directory: str = "outputs/sample_images"

    def __post_init__(self) -> None:
        check_at_least("data.num_images", self.num_images, 8)
        check_image_size("data.image_size", self.image_size)
        sides = list(self.saved_side_px)
        if len(sides) != 2 or not 16 <= sides[0] <= sides[1]:
            raise ConfigError(f"data.saved_side_px={sides!r} is invalid; expected [low, high] with 16 <= low <= high")
        if not 1 <= self.jpeg_quality <= 95:
            raise ConfigError(f"data.jpeg_quality={self.jpeg_quality} is out of range; expected 1..95 (PIL's scale)")
        check_at_least("data.generator_seed", self.generator_seed, 0)


@dataclass
class CustomData(DataConfig):
    """Your own function (Hydra's `_target_`, package.module.function) returning a tf.data.Dataset
    of unbatched (features, int label) examples, or a (train, validation) pair of them; bwopt
    counts the examples once and adds what conf/pipeline/ controls around it."""

    name: str = "custom"
    _target_: str = MISSING
    # Keyword arguments of the function.
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # Labels are in [0, num_classes): the model's output size, which bwopt cannot know up front.
    num_classes: int = MISSING
    # Device-side multiplier after the cast, e.g. 1/255 for 8-bit images.
    feature_scale: float = 1.0

    def __post_init__(self) -> None:
        check_target("data._target_", self._target_)
        check_at_least("data.num_classes", self.num_classes, 2)


# The options of conf/data/ (bwopt.data.sources builds each).
DATA_SCHEMAS = {
    "digits": DigitsData,
    "synthetic": SyntheticData,
    "artificial": ArtificialData,
    "tfrecord": TFRecordData,
    "images": ImagesData,
    "sample_images": SampleImagesData,
    "custom": CustomData,
}


def holds_encoded_images(data) -> bool:
    """Whether the source's examples are encoded images that the pipeline decodes."""
    return data.name in ("images", "sample_images") or (data.name == "tfrecord" and data.format == "image")


def check_data_combination(config) -> None:
    """What a split or a pipeline setting needs from the data source."""
    if config.split.name == "stratified" and config.data.name == "custom":
        raise ConfigError(
            "split=stratified needs every label before the split, which data=custom's function yields only "
            "as it runs; use split=uniform (bwopt holds out examples by a seeded hash of their index)"
        )
    pipeline, encoded = config.pipeline, holds_encoded_images(config.data)
    if pipeline.preprocess != "none" and not encoded:
        raise ConfigError(
            f"pipeline.preprocess={pipeline.preprocess} crops and resizes encoded images, which "
            f"data={config.data.name} does not hold; use data=images, data=sample_images or data=tfrecord "
            "data.format=image, or pipeline.preprocess=none"
        )
    if pipeline.tfrecord.enabled and (encoded or config.data.name == "custom"):
        raise ConfigError(
            f"pipeline.tfrecord.enabled=true writes fixed-size arrays, which data={config.data.name} does not "
            "hold up front; set it to false (for JPEGs in TFRecord files use data=tfrecord data.format=image)"
        )


# --- split ------------------------------------------------------------------

# How examples are held out and sharded (bwopt.data.split builds each).
SPLITS = ("uniform", "stratified")


@dataclass
class SplitConfig:
    name: str = MISSING
    validation_fraction: float = 0.2

    def __post_init__(self) -> None:
        check_choice("split.name", self.name, SPLITS)
        check_fraction("split.validation_fraction", self.validation_fraction)
