"""Training: the distributed, compiled train and evaluation steps, and epochs of them in the timed loop."""

import time
from dataclasses import dataclass
from typing import Callable, Dict, Sequence

from bwopt.loop import Hook, StepRecord, timed_loop
from bwopt.measure.ceilings import read_on_host
from bwopt.measure.timing import StepPlan


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
    """Distributed train and evaluation steps, each returning (summed loss, correct, examples) over replicas.

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
        return tf.reduce_sum(losses), correct, tf.cast(tf.shape(labels)[0], tf.float32)

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
            replica_sums = (replica_sums[0] + slept, *replica_sums[1:])
        return replica_sums

    def replica_evaluate(features, labels):
        logits = model(to_model_inputs(features), training=False)
        return sums(labels, logits, per_example_loss(labels, logits))

    def reduced(replica_fn):
        @tf.function
        def step(batch):
            replica_sums = strategy.run(replica_fn, args=batch)
            return tuple(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in replica_sums)

        return step

    return StepFunctions(reduced(replica_train), reduced(replica_evaluate))


def evaluate(steps: StepFunctions, distributed_validation) -> Dict[str, float]:
    """Mean loss and accuracy over one pass of the distributed validation dataset ({} when it is empty)."""
    loss_sum = correct = num_examples = 0.0
    for batch in distributed_validation:
        batch_loss, batch_correct, batch_examples = read_on_host(steps.evaluate_step(batch))
        loss_sum, correct, num_examples = loss_sum + batch_loss, correct + batch_correct, num_examples + batch_examples
    if not num_examples:
        return {}
    return {"val_loss": float(loss_sum / num_examples), "val_accuracy": float(correct / num_examples)}


class EpochMetrics(Hook):
    """Loss and accuracy of each epoch's training steps, then one validation pass: into the epoch's logs."""

    def __init__(self, steps: StepFunctions, distributed_validation) -> None:
        self.steps = steps
        self.distributed_validation = distributed_validation
        self.sums = [0.0, 0.0, 0.0]
        self.last: Dict[str, float] = {}

    def on_epoch_begin(self, epoch: int) -> None:
        self.sums = [0.0, 0.0, 0.0]

    def on_step_end(self, step: int, record: StepRecord) -> None:
        self.sums = [total + float(value) for total, value in zip(self.sums, record.results)]

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        loss_sum, correct, num_examples = self.sums
        logs.update({"loss": loss_sum / num_examples, "accuracy": correct / num_examples})
        logs.update(evaluate(self.steps, self.distributed_validation))
        self.last = dict(logs)


def train(
    steps: StepFunctions, train_iterator, distributed_validation, plan: StepPlan, hooks: Sequence[Hook] = ()
) -> Dict[str, float]:
    """Train for `plan.epochs` x `plan.steps_per_epoch` timed steps; returns the last epoch's metrics.

    Each step reads its results on the host, so its compute time is the step's on every replica.
    After each epoch, one pass over `distributed_validation`; `hooks` then see the epoch's
    metrics (loss, accuracy, val_loss, val_accuracy) in `on_epoch_end`'s logs. `train_iterator`
    is an iterator over the distributed training dataset; the caller keeps it, warm, for what it
    measures after training.
    """
    metrics = EpochMetrics(steps, distributed_validation)
    step = lambda batch: read_on_host(steps.train_step(batch))  # noqa: E731
    timed_loop(train_iterator, step, plan.epochs, plan.steps_per_epoch, [metrics, *hooks])
    return metrics.last
