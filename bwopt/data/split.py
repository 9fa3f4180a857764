"""Train/validation split and per-worker shards, uniform or stratified by class."""

from typing import Tuple

import numpy as np

SPLITS = ("uniform", "stratified")


def train_validation_split(
    labels: np.ndarray, name: str, validation_fraction: float, seed: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Indices of the training and validation examples.

    uniform: the last `validation_fraction` of a seeded permutation is validation.
    stratified: each class contributes round(fraction * class size) examples to validation,
    so both splits keep the class proportions to within one example per class.
    """
    rng = np.random.default_rng(seed)
    if name == "uniform":
        order = rng.permutation(len(labels))
        num_validation = int(round(validation_fraction * len(labels)))
        return np.sort(order[num_validation:]), np.sort(order[:num_validation])
    if name != "stratified":
        raise ValueError(f"unknown split {name!r}; expected one of: {', '.join(SPLITS)}")
    train, validation = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        num_validation = int(round(validation_fraction * len(members)))
        validation.append(members[:num_validation])
        train.append(members[num_validation:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(validation))


def shard(indices: np.ndarray, labels: np.ndarray, name: str, num_shards: int, shard_index: int) -> np.ndarray:
    """The part of `indices` that belongs to shard `shard_index` of `num_shards`.

    uniform: even contiguous blocks (sizes differ by at most one).
    stratified: each class's examples are dealt round-robin, so every shard keeps the
    class proportions to within one example per class.
    Shards are disjoint and together cover `indices`.
    """
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} is outside [0, {num_shards})")
    if name == "uniform":
        return np.array_split(indices, num_shards)[shard_index]
    if name != "stratified":
        raise ValueError(f"unknown split {name!r}; expected one of: {', '.join(SPLITS)}")
    mine = [
        members[shard_index::num_shards]
        for label in np.unique(labels[indices])
        for members in [indices[labels[indices] == label]]
    ]
    return np.sort(np.concatenate(mine))
