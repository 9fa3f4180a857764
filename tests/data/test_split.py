import numpy as np
import pytest

from bwopt.data.sources import load_digits
from bwopt.data.split import shard, train_validation_split


@pytest.fixture(scope="module")
def labels():
    return load_digits().labels


def class_counts(labels, num_classes=10):
    return np.bincount(labels, minlength=num_classes)


@pytest.mark.parametrize("name", ["uniform", "stratified"])
def test_train_and_validation_are_disjoint_and_cover_everything(labels, name):
    train, validation = train_validation_split(labels, name, 0.2, seed=3)
    assert len(np.intersect1d(train, validation)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, validation])), np.arange(len(labels)))
    assert abs(len(validation) - 0.2 * len(labels)) <= 10


def test_stratified_validation_keeps_class_proportions_within_one_example(labels):
    train, validation = train_validation_split(labels, "stratified", 0.2, seed=3)
    expected = 0.2 * class_counts(labels)
    assert np.all(np.abs(class_counts(labels[validation]) - expected) <= 1)


def test_split_is_seeded(labels):
    first = train_validation_split(labels, "uniform", 0.2, seed=1)[1]
    assert np.array_equal(first, train_validation_split(labels, "uniform", 0.2, seed=1)[1])
    assert not np.array_equal(first, train_validation_split(labels, "uniform", 0.2, seed=2)[1])


@pytest.mark.parametrize("name", ["uniform", "stratified"])
@pytest.mark.parametrize("num_shards", [2, 3, 7])
def test_shards_are_disjoint_and_cover_the_split(labels, name, num_shards):
    train, _ = train_validation_split(labels, "stratified", 0.2, seed=0)
    shards = [shard(train, labels, name, num_shards, index) for index in range(num_shards)]
    assert sum(len(part) for part in shards) == len(train)
    assert np.array_equal(np.sort(np.concatenate(shards)), train)


@pytest.mark.parametrize("num_shards", [2, 3, 7])
def test_stratified_shards_keep_class_proportions_within_one_example(labels, num_shards):
    train, _ = train_validation_split(labels, "stratified", 0.2, seed=0)
    expected = class_counts(labels[train]) / num_shards
    for index in range(num_shards):
        counts = class_counts(labels[shard(train, labels, "stratified", num_shards, index)])
        assert np.all(np.abs(counts - expected) < 1)


def test_uniform_shards_are_even_contiguous_blocks(labels):
    train = np.arange(100)
    shards = [shard(train, labels, "uniform", 3, index) for index in range(3)]
    assert [len(part) for part in shards] == [34, 33, 33]
    assert all(np.array_equal(part, np.arange(part[0], part[-1] + 1)) for part in shards)


def test_unknown_split_names_the_choices(labels):
    with pytest.raises(ValueError, match="uniform, stratified"):
        train_validation_split(labels, "random", 0.2, seed=0)
