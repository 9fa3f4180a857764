"""Train/validation split and per-worker shards, uniform or stratified by class."""

from typing import Callable, Dict, Tuple

import numpy as np


def train_validation_split(
    labels: np.ndarray, name: str, validation_fraction: float, seed: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Indices of the training and validation examples, held out as split `name` says.

    uniform: the last `validation_fraction` of a seeded permutation is validation.
    stratified: each class contributes round(fraction * class size) examples to validation,
    so both splits keep the class proportions to within one example per class.
    """
    return _choose(HOLD_OUTS, name)(labels, validation_fraction, np.random.default_rng(seed))


def _uniform_hold_out(labels: np.ndarray, validation_fraction: float, rng) -> Tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(len(labels))
    num_validation = int(round(validation_fraction * len(labels)))
    return np.sort(order[num_validation:]), np.sort(order[:num_validation])


def _stratified_hold_out(labels: np.ndarray, validation_fraction: float, rng) -> Tuple[np.ndarray, np.ndarray]:
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
    return _choose(SHARDINGS, name)(indices, labels, num_shards, shard_index)


def _uniform_shard(indices: np.ndarray, labels: np.ndarray, num_shards: int, shard_index: int) -> np.ndarray:
    return np.array_split(indices, num_shards)[shard_index]


def _stratified_shard(indices: np.ndarray, labels: np.ndarray, num_shards: int, shard_index: int) -> np.ndarray:
    mine = [
        members[shard_index::num_shards]
        for label in np.unique(labels[indices])
        for members in [indices[labels[indices] == label]]
    ]
    return np.sort(np.concatenate(mine))


# Keyed by the split names of bwopt.schema.SPLITS.
HOLD_OUTS: Dict[str, Callable] = {"uniform": _uniform_hold_out, "stratified": _stratified_hold_out}
SHARDINGS: Dict[str, Callable] = {"uniform": _uniform_shard, "stratified": _stratified_shard}


def _choose(table: Dict[str, Callable], name: str) -> Callable:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown split {name!r}; expected one of: {', '.join(table)}") from None
