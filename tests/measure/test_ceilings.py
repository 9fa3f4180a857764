"""Ceilings against workloads of known cost: a generator and a step that sleep 10 ms each.

Tolerance: a ceiling must land between 0.6x and 1.05x of batch / 10 ms. `time.sleep` never
returns early, so a batch cannot take less than 10 ms and the ceiling cannot beat the ideal
(1.05x leaves room for clock granularity only). It falls short by the sleep's overshoot
(0.13-0.16 ms here), tf.data / py_function / distributed-iterator overhead and thread wake-ups:
measured on this 2-core machine at 0.77-0.94x for the input ceiling and 0.86-0.87x for the
compute ceiling. 0.6x (16.7 ms a step) leaves room for scheduler delays on a loaded machine.
"""

import itertools
import time

import numpy as np
import pytest

from bwopt.loop import timed_loop
from bwopt.measure.ceilings import CpuClock, compute_ceiling, input_ceiling

BATCH = 32
FEATURES = 8
SLEEP_S = 0.010
IDEAL_EXAMPLES_PER_S = BATCH / SLEEP_S
BYTES_PER_STEP = BATCH * (FEATURES * 1 + 4)  # uint8 features + int32 labels


def slow_dataset():
    """Global batches of (uint8 features, int32 labels), each produced after a 10 ms sleep."""
    import tensorflow as tf

    def batches():
        while True:
            time.sleep(SLEEP_S)
            yield np.ones((BATCH, FEATURES), np.uint8), np.arange(BATCH, dtype=np.int32) % 10

    signature = (
        tf.TensorSpec((BATCH, FEATURES), tf.uint8),
        tf.TensorSpec((BATCH,), tf.int32),
    )
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def mirrored(devices):
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(devices.device_names)


def default_strategy(devices):
    import tensorflow as tf

    return tf.distribute.get_strategy()


@pytest.mark.timing
@pytest.mark.parametrize("make_strategy", [default_strategy, mirrored])
def test_input_ceiling_of_a_pipeline_with_a_known_cost_per_batch(devices, make_strategy):
    strategy = make_strategy(devices)
    distributed = strategy.experimental_distribute_dataset(slow_dataset())
    examples_per_s, bytes_per_s = input_ceiling(distributed, 30, 3, BATCH, BYTES_PER_STEP)
    assert 0.6 * IDEAL_EXAMPLES_PER_S <= examples_per_s <= 1.05 * IDEAL_EXAMPLES_PER_S
    assert bytes_per_s / examples_per_s == pytest.approx(BYTES_PER_STEP / BATCH)


def test_input_ceiling_accepts_an_iterator_and_says_when_the_data_ends():
    import tensorflow as tf

    iterator = iter(tf.distribute.get_strategy().experimental_distribute_dataset(slow_dataset()))
    examples_per_s, _ = input_ceiling(iterator, 10, 1, BATCH, BYTES_PER_STEP)
    assert examples_per_s <= 1.05 * IDEAL_EXAMPLES_PER_S
    finite = tf.data.Dataset.from_tensor_slices(np.zeros((5, FEATURES), np.uint8)).batch(1)
    with pytest.raises(ValueError, match="ended before the 6 batches"):
        input_ceiling(finite, 5, 1, 1, FEATURES)


@pytest.mark.timing
def test_compute_ceiling_of_a_step_with_a_known_cost():
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()

    def replica_step(features, labels):
        slept = tf.py_function(lambda: time.sleep(SLEEP_S) or 0.0, [], tf.float32)
        return tf.reduce_sum(tf.cast(features, tf.float32)) + slept

    @tf.function
    def step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=batch), axis=None)

    batch = next(iter(strategy.experimental_distribute_dataset(slow_dataset())))
    examples_per_s = compute_ceiling(step, batch, 30, 3, BATCH)
    assert 0.6 * IDEAL_EXAMPLES_PER_S <= examples_per_s <= 1.05 * IDEAL_EXAMPLES_PER_S


@pytest.mark.timing
def test_compute_ceiling_of_a_cheap_step_is_not_held_back_by_a_slow_pipeline():
    import keras
    import tensorflow as tf

    from bwopt.train import StepSettings, make_step_functions

    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    steps = make_step_functions(strategy, model, optimizer, StepSettings(BATCH, 1 / 255))
    distributed = strategy.experimental_distribute_dataset(slow_dataset())
    batch = next(iter(distributed))
    weights_before = [np.array(weight) for weight in model.trainable_variables]

    examples_per_s = compute_ceiling(steps.train_step, batch, 50, 5, BATCH)

    # The slow generator would cap it at 3,200 examples/s; the step alone measured ~75,000 here.
    assert examples_per_s > 3 * IDEAL_EXAMPLES_PER_S
    # It was the real train step: 55 SGD updates moved the weights.
    weights_after = [np.array(weight) for weight in model.trainable_variables]
    assert any(not np.allclose(before, after) for before, after in zip(weights_before, weights_after))


@pytest.mark.timing
def test_the_cpu_clock_reads_the_cpu_time_steps_spend_and_not_the_time_they_sleep():
    def spin(_):  # 10 ms of this thread's CPU time, however busy the machine is
        until = time.thread_time() + SLEEP_S
        while time.thread_time() < until:
            pass

    spinning, sleeping = CpuClock(2, 11), CpuClock(2, 11)  # steps 2-11 of 12: ten steps
    timed_loop(itertools.repeat(None), spin, 1, 12, [spinning])
    timed_loop(itertools.repeat(None), lambda _: time.sleep(SLEEP_S), 1, 12, [sleeping])
    # At least the spin's own CPU time; other threads of this process (a test's leftover tf.data
    # iterator) can only add to it.
    assert 10 * SLEEP_S <= spinning.cpu_s <= 20 * SLEEP_S
    assert sleeping.cpu_s < 3 * SLEEP_S


def test_a_step_holds_the_whole_cores_it_keeps_busy_and_the_cores_ceiling_counts_them():
    """The cores ceiling of a step that spans the cores counts them for its wall time: on 2 cores a
    step of 3.2 ms per example that keeps 1.74 cores busy (5.6 CPU-ms, MobileNetV2 at 64x64 on this
    machine) holds both, so with 0.56 CPU-ms of pipeline per example the cores sustain
    2 / (2 x 3.2 + 0.56) = 287 examples/s, not 2 / (5.6 + 0.56) = 325."""
    from bwopt.measure.ceilings import cores_ceiling, step_cores

    assert step_cores(2, 0.0056, 0.0032) == 2
    assert step_cores(2, 0.0014, 0.0010) == 1  # 1.4 cores: its other threads mostly sleep
    assert step_cores(2, 0.0100, 0.0010) == 2  # never more than the cores
    assert step_cores(16, 0.0053, 0.0010) == 5
    assert step_cores(2, 0.0005, 0.0010) == 1  # a step that waits (on an accelerator) holds one
    assert cores_ceiling(2, 0.0056, 0.00056, 0.0032) == pytest.approx(2 / (2 * 0.0032 + 0.00056))
    assert cores_ceiling(2, 0.0056, 0.00056) == pytest.approx(2 / (0.0056 + 0.00056))  # no wall time: CPU alone
    # A step on one core costs its CPU time: more than its wall time (1.4 cores busy), or less
    # (a step that waits, on an accelerator, 0.3 cores busy).
    assert cores_ceiling(2, 0.0014, 0.0006, 0.0010) == pytest.approx(2 / (0.0014 + 0.0006))
    assert cores_ceiling(2, 0.0003, 0.0006, 0.0010) == pytest.approx(2 / (0.0003 + 0.0006))
