"""The timed training loop: `strategy.run` inside `tf.function`, input wait timed around `next()`."""

import signal
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from bwopt.measure import StepTimer


class GracefulStop:
    """SIGINT or SIGTERM ends the run between two steps, as KILLED, with what it measured.

    Raising from the signal handler itself would interrupt TensorFlow inside an iterator's
    `get_next`, which can corrupt its heap; so the first signal only asks the loop to stop at
    the next step boundary, and a second one stops at once.
    """

    def __init__(self) -> None:
        self.requested: Optional[str] = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        already = self.requested
        self.requested = signal.Signals(signum).name
        if already:
            raise KeyboardInterrupt(f"stopped at once by a second {self.requested}")

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"stopped by {self.requested}")


STOP = GracefulStop()


@dataclass
class StepFunctions:
    train_step: Callable
    evaluate_step: Callable


def make_step_functions(
    strategy,
    model,
    optimizer,
    global_batch_size: int,
    feature_scale: float,
    jit_compile: bool,
    step_compute_s: float = 0.0,
):
    """Distributed train and evaluation steps, each returning (summed loss, correct count) over replicas.

    `step_compute_s` adds a known sleep to every train step (the artificial workload).
    """
    import keras
    import tensorflow as tf

    per_example_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    compute_dtype = keras.mixed_precision.global_policy().compute_dtype

    def to_model_inputs(features):
        # The host sends features in the transfer dtype; normalising here keeps the bus narrow.
        return tf.cast(features, compute_dtype) * tf.cast(feature_scale, compute_dtype)

    def sums(labels, logits, losses):
        predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
        correct = tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.float32))
        return tf.reduce_sum(losses), correct

    # XLA compiles the math; the gradient all-reduce stays outside the compiled function.
    @tf.function(jit_compile=jit_compile or None)
    def forward_backward(features, labels):
        with tf.GradientTape() as tape:
            logits = model(to_model_inputs(features), training=True)
            losses = per_example_loss(labels, logits)
            # Keras sums gradients over replicas, so each replica scales by the global batch.
            loss = tf.reduce_sum(losses) / global_batch_size
            # Identity unless a loss-scale optimizer guards float16 gradients.
            scaled_loss = optimizer.scale_loss(loss)
        return tape.gradient(scaled_loss, model.trainable_variables), sums(labels, logits, losses)

    def replica_train(features, labels):
        gradients, replica_sums = forward_backward(features, labels)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if step_compute_s:
            slept = tf.py_function(lambda: time.sleep(step_compute_s) or 0.0, [], tf.float32)
            replica_sums = (replica_sums[0] + slept, replica_sums[1])
        return replica_sums

    def replica_evaluate(features, labels):
        logits = model(to_model_inputs(features), training=False)
        return sums(labels, logits, per_example_loss(labels, logits))

    def reduced(replica_fn):
        @tf.function
        def step(batch):
            loss_sum, correct = strategy.run(replica_fn, args=batch)
            return (
                strategy.reduce(tf.distribute.ReduceOp.SUM, loss_sum, axis=None),
                strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None),
            )

        return step

    return StepFunctions(reduced(replica_train), reduced(replica_evaluate))


def evaluate(steps: StepFunctions, distributed_validation, num_examples: int) -> Dict[str, float]:
    loss_sum = correct = 0.0
    for batch in distributed_validation:
        batch_loss, batch_correct = steps.evaluate_step(batch)
        loss_sum += float(batch_loss)
        correct += float(batch_correct)
    return {"val_loss": loss_sum / num_examples, "val_accuracy": correct / num_examples}


def train(
    steps: StepFunctions,
    train_iterator,
    distributed_validation,
    *,
    epochs: int,
    steps_per_epoch: int,
    examples_per_step: int,
    num_validation_examples: int,
    timer: StepTimer,
    on_epoch_end: Callable[[int, Dict[str, float]], None],
    progress,
    profiler,
) -> Dict[str, float]:
    """Run `epochs` x `steps_per_epoch` timed steps; returns the last epoch's metrics.

    `train_iterator` is an iterator over the distributed training dataset; the caller keeps it,
    warm, for what it measures after training.

    `progress` (bwopt.report.ProgressBar) and `profiler` (bwopt.profiling.StepProfiler) are
    called outside the timed part of each step.
    """
    for epoch in range(epochs):
        loss_sum = correct = 0.0
        progress.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            profiler.on_step_begin(epoch * steps_per_epoch + step)
            started = time.perf_counter()
            batch = next(train_iterator)
            fetched = time.perf_counter()
            batch_loss, batch_correct = steps.train_step(batch)
            # Reading the results on the host waits for the step to finish on every replica.
            loss_sum += float(batch_loss)
            correct += float(batch_correct)
            timer.record(fetched - started, time.perf_counter() - fetched)
            profiler.on_step_end(epoch * steps_per_epoch + step)
            progress.on_step_end(epoch, step)
            STOP.check()
        progress.on_epoch_end(epoch)
        num_examples = steps_per_epoch * examples_per_step
        metrics = {"loss": loss_sum / num_examples, "accuracy": correct / num_examples}
        metrics.update(evaluate(steps, distributed_validation, num_validation_examples))
        on_epoch_end(epoch, metrics)
    return metrics
