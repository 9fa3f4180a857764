import numpy as np

from bwopt.data.sources import load_digits, load_synthetic
from bwopt.schema import SyntheticData


def test_digits_are_the_bundled_8x8_images():
    source = load_digits()
    assert source.features.shape == (1797, 8, 8, 1)
    assert source.features.dtype == np.uint8 and source.features.max() == 16
    assert source.num_classes == 10 and source.feature_scale == 1 / 16


def test_synthetic_has_the_configured_shape_dtype_and_a_learnable_signal():
    config = SyntheticData(num_examples=600, image_shape=[8, 8, 3], num_classes=4, signal=1.0)
    source = load_synthetic(config, seed=0)
    assert source.features.shape == (600, 8, 8, 3) and source.features.dtype == np.uint8
    assert set(np.unique(source.labels)) == {0, 1, 2, 3}
    # A nearest-class-mean classifier fitted on half the data separates the other half.
    flat = source.features.reshape(600, -1).astype(np.float32)
    means = np.stack([flat[:300][source.labels[:300] == c].mean(0) for c in range(4)])
    predicted = np.argmin(((flat[300:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == source.labels[300:]).mean() > 0.9


def test_synthetic_without_signal_is_not_learnable():
    config = SyntheticData(num_examples=600, image_shape=[8, 8, 3], num_classes=4, signal=0.0)
    source = load_synthetic(config, seed=0)
    flat = source.features.reshape(600, -1).astype(np.float32)
    means = np.stack([flat[:300][source.labels[:300] == c].mean(0) for c in range(4)])
    predicted = np.argmin(((flat[300:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == source.labels[300:]).mean() < 0.4
