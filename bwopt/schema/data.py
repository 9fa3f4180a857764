"""Schemas of conf/data/ and conf/split/."""

from dataclasses import dataclass, field
from typing import List

from omegaconf import MISSING

from bwopt.schema.checks import TFRECORD_COMPRESSIONS, ConfigError, check_at_least, check_choice, check_fraction

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

    def __post_init__(self) -> None:
        check_choice("data.compression", self.compression, TFRECORD_COMPRESSIONS)
        check_choice("data.feature_dtype", self.feature_dtype, ("uint8", "int32", "int64", "float16", "float32"))
        check_at_least("data.num_classes", self.num_classes, 2)


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
