"""Inference figures: forward passes only, one batch size at a time, input already on the device."""

import time
from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np


@dataclass
class InferenceFigures:
    """Forward-pass figures for one batch size, over the timed (post warm-up) batches.

    Attributes:
        batch_size: examples per forward pass.
        examples_per_s: batch_size x num_timed_batches / the sum of their latencies.
        latency_p50_s, latency_p90_s, latency_p99_s: percentiles of the per-batch latency
            (linear interpolation between order statistics).
        num_timed_batches: forward passes measured, warm-up excluded.
    """

    batch_size: int
    examples_per_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    num_timed_batches: int

    def metrics(self) -> Dict[str, float]:
        """MLflow metrics named by batch size, e.g. `inference_bs32_latency_p50_s`."""
        prefix = f"inference_bs{self.batch_size}_"
        return {
            prefix + "examples_per_s": self.examples_per_s,
            prefix + "latency_p50_s": self.latency_p50_s,
            prefix + "latency_p90_s": self.latency_p90_s,
            prefix + "latency_p99_s": self.latency_p99_s,
            prefix + "num_timed_batches": self.num_timed_batches,
        }


def measure_inference(
    model,
    feature_shape: Sequence[int],
    feature_dtype: str,
    batch_sizes: List[int],
    num_batches: int,
    warmup_batches: int,
    feature_scale: float = 1.0,
) -> List[InferenceFigures]:
    """Time forward passes of `model` at each batch size, in the order given.

    Timed, per batch: one call of a `tf.function` forward pass (cast to the compute dtype, scale
    by `feature_scale`, `model(..., training=False)`) through the concrete function traced for
    the batch's shape, as training calls its steps (bwopt.train.DirectCall: no per-call argument
    matching), plus copying its output to the host, which waits for the pass to finish.
    Excluded: building the input (one random batch per batch size, made once and placed where
    TensorFlow places ops, a GPU when there is one, so no host-to-device copy is timed) and the
    first `warmup_batches` passes at each size (tracing for the new shape).

    Raises:
        ValueError: when `num_batches` < 1.
    """
    if num_batches < 1:
        raise ValueError(f"num_batches={num_batches}: at least one forward pass must be timed")
    forward = _forward_pass(model, feature_scale)
    return [
        _time_batches(forward, _input_batch(feature_shape, feature_dtype, batch_size), num_batches, warmup_batches)
        for batch_size in batch_sizes
    ]


def _forward_pass(model, feature_scale: float):
    import keras
    import tensorflow as tf

    from bwopt.train import compiled

    compute_dtype = keras.mixed_precision.global_policy().compute_dtype

    def forward(features):
        return model(tf.cast(features, compute_dtype) * tf.cast(feature_scale, compute_dtype), training=False)

    return compiled("forward", forward)  # one trace per batch size, counted as this run's (bwopt.train.compiled)


def _input_batch(feature_shape: Sequence[int], feature_dtype: str, batch_size: int):
    """A seeded random batch, values in [0, 255] whatever the dtype, made into a device tensor."""
    import tensorflow as tf

    values = np.random.default_rng(batch_size).integers(0, 256, size=(batch_size, *feature_shape))
    # tf.identity runs where eager ops run by default (GPU:0 if any), moving the batch there once.
    return tf.identity(tf.constant(values, dtype=feature_dtype))


def _time_batches(forward, features, num_batches: int, warmup_batches: int) -> InferenceFigures:
    for _ in range(warmup_batches):
        _to_host(forward(features))
    forward = forward.get_concrete_function(features)
    latencies_s = []
    for _ in range(num_batches):
        started = time.perf_counter()
        _to_host(forward(features))
        latencies_s.append(time.perf_counter() - started)
    p50, p90, p99 = np.percentile(latencies_s, [50, 90, 99])
    batch_size = int(features.shape[0])
    return InferenceFigures(
        batch_size=batch_size,
        examples_per_s=batch_size * num_batches / float(np.sum(latencies_s)),
        latency_p50_s=float(p50),
        latency_p90_s=float(p90),
        latency_p99_s=float(p99),
        num_timed_batches=num_batches,
    )


def _to_host(outputs) -> None:
    """Copy every output tensor to the host, which waits for the forward pass to finish."""
    import tensorflow as tf

    for output in tf.nest.flatten(outputs):
        np.asarray(output)
