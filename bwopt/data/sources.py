"""Data sources: each returns the whole data set as host arrays with what the model needs to know."""

from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import numpy as np


@dataclass
class ArraySource:
    """Features as stored on the host, and how the device turns them into model inputs.

    Attributes:
        features: raw features, shape (num_examples, *feature_shape), dtype as stored.
        labels: int32 class ids, shape (num_examples,).
        num_classes: number of classes.
        feature_scale: the device multiplies features by this after casting (e.g. 1/255).
    """

    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    feature_scale: float

    @property
    def feature_shape(self) -> Tuple[int, ...]:
        return tuple(self.features.shape[1:])

    @property
    def num_examples(self) -> int:
        return len(self.labels)


def load_digits(config, seed: int) -> ArraySource:
    """scikit-learn's bundled digits: 8x8 images with 17 grey levels (0..16)."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    features = digits.images.astype(np.uint8)[..., np.newaxis]
    return ArraySource(features, digits.target.astype(np.int32), 10, 1.0 / 16.0)


def load_synthetic(config, seed: int) -> ArraySource:
    """Images around one random prototype per class; `signal` sets how far apart the classes are."""
    rng = np.random.default_rng(seed)
    shape = tuple(config.image_shape)
    labels = rng.integers(0, config.num_classes, size=config.num_examples, dtype=np.int32)
    prototypes = rng.standard_normal((config.num_classes, *shape), dtype=np.float32)
    features = np.empty((config.num_examples, *shape), dtype=np.float32)
    for start in range(0, config.num_examples, 256):  # bounded temporaries for big shapes
        chunk = labels[start : start + 256]
        noise = rng.standard_normal((len(chunk), *shape), dtype=np.float32)
        features[start : start + 256] = config.signal * prototypes[chunk] + noise
    if config.dtype == "uint8":
        features = np.clip(128.0 + 32.0 * features, 0, 255).astype(np.uint8)
        return ArraySource(features, labels, config.num_classes, 1.0 / 255.0)
    return ArraySource(features, labels, config.num_classes, 1.0)


SOURCES: Dict[str, Callable] = {"digits": load_digits, "synthetic": load_synthetic}


def load_source(config, seed: int) -> ArraySource:
    try:
        loader = SOURCES[config.name]
    except KeyError:
        raise ValueError(f"unknown data source {config.name!r}; expected one of: {', '.join(SOURCES)}")
    return loader(config, seed)
