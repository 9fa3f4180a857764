"""Throughput ceilings: the train step alone and the input pipeline alone.

Training cannot run faster than either part on its own, so the lower ceiling is what a perfect
overlap of input and compute would reach (see `bwopt.measure.efficiency`). Both ceilings time
`num_steps` steps back to back on the host's monotonic clock after `warmup_steps` untimed ones
(tracing, autotuning, buffer fill), and divide the examples of the timed steps by their wall time.
"""

import time
from typing import Callable, Iterable, Tuple

import numpy as np


def compute_ceiling(
    train_step: Callable, distributed_batch, num_steps: int, warmup_steps: int, examples_per_step: int
) -> float:
    """Examples/s of the compiled distributed train step alone, with no input wait.

    Timed: `num_steps` calls of `train_step(distributed_batch)` on the same batch, one already
    produced by the distributed iterator (so already on the replicas' devices), each call
    synchronised like `bwopt.train.train` does, by reading all its results on the host.
    Excluded: the `warmup_steps` calls before (tracing, XLA compilation); no `next()` is timed.

    The step is the real one, so each call applies an optimizer update: measure on a model whose
    weights may change (after training, or a copy), never in the middle of a measured run.
    """
    for _ in range(warmup_steps):
        _read_on_host(train_step(distributed_batch))
    started = time.perf_counter()
    for _ in range(num_steps):
        _read_on_host(train_step(distributed_batch))
    return num_steps * examples_per_step / (time.perf_counter() - started)


def input_ceiling(
    distributed_dataset_or_iterator: Iterable,
    num_steps: int,
    warmup_steps: int,
    examples_per_step: int,
    bytes_per_step: int,
) -> Tuple[float, float]:
    """(examples/s, bytes/s) of the distributed input pipeline alone, no training.

    Timed: `num_steps` calls of `next()` on the distributed iterator, each followed by
    `wait_for_batch`, which waits until every per-replica tensor is really there (on a GPU,
    `next()` may return before the copy to the device has finished) without copying the batch
    back: about a microsecond per tensor on a CPU device, two small eager ops per tensor and
    replica on a GPU or TPU, included in the time. Excluded: the `warmup_steps` batches before
    (autotuning, prefetch and cache fill). `bytes_per_step` is the bytes of one global batch as
    transferred, features plus labels.

    Raises:
        ValueError: when the dataset ends before `warmup_steps + num_steps` batches.
    """
    iterator = iter(distributed_dataset_or_iterator)
    for _ in range(warmup_steps):
        wait_for_batch(_next_batch(iterator, warmup_steps + num_steps))
    started = time.perf_counter()
    for _ in range(num_steps):
        wait_for_batch(_next_batch(iterator, warmup_steps + num_steps))
    wall_s = time.perf_counter() - started
    return num_steps * examples_per_step / wall_s, num_steps * bytes_per_step / wall_s


def _next_batch(iterator, num_needed: int):
    try:
        return next(iterator)
    except StopIteration:
        raise ValueError(
            f"the dataset ended before the {num_needed} batches the input ceiling needs; repeat it"
        ) from None


def wait_for_batch(batch) -> None:
    """Wait until every tensor of a batch (per-replica values expanded) is materialised.

    A tensor on a CPU device is viewed as a NumPy array (no copy); on a GPU or TPU one element
    is sliced on that device and read on the host, so the batch is not copied back.
    """
    import tensorflow as tf

    for tensor in tf.nest.flatten(batch, expand_composites=True):
        if tf.DeviceSpec.from_string(tensor.device).device_type == "CPU":
            np.asarray(tensor)  # a view of the buffer, no copy, once the tensor is ready
            continue
        # Slice where the tensor lives (elsewhere it would be copied whole first), read one element.
        with tf.device(tensor.device):
            np.asarray(tf.reshape(tensor, [-1])[:1])


def _read_on_host(results) -> None:
    """Copy every result tensor (per-replica ones expanded) to the host, waiting for the step."""
    import tensorflow as tf

    for tensor in tf.nest.flatten(results, expand_composites=True):
        np.asarray(tensor)
