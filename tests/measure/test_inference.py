"""Inference figures against a forward pass of known cost (a 5 ms sleep) and a real small MLP.

Tolerance for the 5 ms pass: p50 between 5.0 ms and 5.0 ms + the same pass without the sleep
(measured beside it) + 3 ms. `time.sleep` never returns early, so 5.0 ms is a hard floor. Above
it, measured on 2-core machines: the pass without the sleep (py_function, tf.function dispatch, a
tiny Dense layer, the host read) takes 0.6-0.9 ms, and sleeping adds 0.5-1.9 ms more (0.13-0.2 ms
sleep overshoot, then waking the sleeping thread and the executor waiting on it, which varies by
machine), so p50 lands at 6.0-7.8 ms; the rest leaves room for a loaded machine, and the median
ignores the rare multi-millisecond scheduler delays.
"""

import time

import pytest

from bwopt.measure.inference import InferenceFigures, measure_inference

SLEEP_S = 0.005


def model_that_sleeps(num_features: int, sleep_s: float = SLEEP_S):
    import keras
    import tensorflow as tf

    class Sleep(keras.layers.Layer):
        def call(self, inputs):
            slept = tf.py_function(lambda: time.sleep(sleep_s) or 0.0, [], tf.float32)
            # py_function's output has an unknown shape; a scalar keeps the model's shapes known.
            return inputs + tf.reshape(tf.cast(slept, inputs.dtype), [])

    return keras.Sequential([keras.Input((num_features,)), Sleep(), keras.layers.Dense(4)])


@pytest.mark.timing
def test_latency_of_a_forward_pass_with_a_known_cost():
    (figures,) = measure_inference(model_that_sleeps(8), (8,), "uint8", [16], num_batches=30, warmup_batches=2)
    (awake,) = measure_inference(model_that_sleeps(8, 0.0), (8,), "uint8", [16], num_batches=30, warmup_batches=2)
    assert figures.batch_size == 16 and figures.num_timed_batches == 30
    assert SLEEP_S <= figures.latency_p50_s <= SLEEP_S + awake.latency_p50_s + 0.003
    assert figures.latency_p50_s <= figures.latency_p90_s <= figures.latency_p99_s
    # Throughput is batch / mean latency; the mean sits between p50 and p99.
    assert 16 / figures.latency_p99_s <= figures.examples_per_s <= 16 / SLEEP_S


def test_larger_batches_of_a_small_mlp_give_more_examples_per_s():
    import keras

    model = keras.Sequential(
        [keras.Input((8, 8)), keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    small, large = measure_inference(
        model, (8, 8), "uint8", [1, 256], num_batches=40, warmup_batches=3, feature_scale=1 / 255
    )
    assert (small.batch_size, large.batch_size) == (1, 256)
    # A batch of 1 is all dispatch overhead; 256 examples cost far less than 256 times that.
    assert large.examples_per_s > 10 * small.examples_per_s


def test_metrics_are_named_by_batch_size():
    figures = InferenceFigures(32, 3200.0, 0.010, 0.011, 0.012, 20)
    assert figures.metrics() == {
        "inference_bs32_examples_per_s": 3200.0,
        "inference_bs32_latency_p50_s": 0.010,
        "inference_bs32_latency_p90_s": 0.011,
        "inference_bs32_latency_p99_s": 0.012,
        "inference_bs32_num_timed_batches": 20,
    }


def test_no_timed_batch_is_an_error():
    with pytest.raises(ValueError, match="num_batches=0"):
        measure_inference(None, (8,), "uint8", [1], num_batches=0, warmup_batches=1)
