"""Training: the distributed, compiled train and evaluation steps, and epochs of them in the timed loop.

With `steps_per_execution` N > 1 (Keras's name and meaning), one call of a compiled function runs
N training steps: a loop in the graph takes each batch from the distributed iterator and runs the
distributed step, and the host reads the summed results once per call. The timed loop then
times executions, not steps (`bwopt.measure.timing` says what that means for the figures).
"""

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bwopt.loop import Hook, StepRecord, timed_loop
from bwopt.measure.timing import StepPlan


@dataclass
class StepFunctions:
    """Compiled distributed functions, each returning one float32 vector of the sums over replicas
    (loss, correct predictions, examples): one tensor, so the host reads a step's results in one
    read (three tensors read one by one cost ~3 % of a 1 ms step here, one ~1 %).

    Attributes:
        train_step: one training step on a distributed batch.
        evaluate_step: one evaluation step on a distributed batch.
        empty_step: the train step's signature and reduction with no computation (dispatch cost).
        train_execution: N training steps on batches taken from a distributed iterator inside
            the graph, results summed; None when steps_per_execution is 1.
        steps_per_execution: N.
        read_each_step: whether the timed loop reads each training step's results on the host
            when the step returns (see `calls_return_when_done`); otherwise the results stay
            tensors until the hooks read many steps' at once.
    """

    train_step: Callable
    evaluate_step: Callable
    empty_step: Optional[Callable] = None
    train_execution: Optional[Callable] = None
    steps_per_execution: int = 1
    read_each_step: bool = True


@dataclass(frozen=True)
class StepSettings:
    """How the step functions compute.

    Attributes:
        global_batch_size: examples per step over all replicas (each replica's loss is scaled by it).
        feature_scale: the factor that turns the transferred features into the model's inputs.
        jit_compile: XLA-compile the forward and backward pass.
        step_compute_s: a known sleep added to every train step (the artificial workload).
        steps_per_execution: N > 1 adds `train_execution`, N steps per call.
        direct_calls: call each compiled function through its concrete function (`DirectCall`);
            off where a coordinator schedules the functions (parameter server) or a TPU runs them.
    """

    global_batch_size: int
    feature_scale: float = 1.0
    jit_compile: bool = False
    step_compute_s: float = 0.0
    steps_per_execution: int = 1
    direct_calls: bool = True


class DirectCall:
    """A `tf.function` of one argument, called through the concrete function it traced for that
    argument's signature.

    A `tf.function` call matches its arguments against its traces on every call; on this 2-core
    host that costs ~170 us (an MLP 128 step at batch 64: 849 us called as a `tf.function`, 681 us
    through its concrete function, 30 alternated rounds), a quarter of a short step, the same
    graph run either way. Training batches keep one signature; an argument of another (a
    validation pass's smaller last batch) fails to bind before anything runs (TypeError), goes
    through the `tf.function`, which traces it if needed, and its concrete function is kept beside
    the others (at most `MAX_SIGNATURES`, else the `tf.function` takes the rest).
    """

    MAX_SIGNATURES = 4

    def __init__(self, function) -> None:
        self.function = function
        self.concrete: List[Callable] = []

    def __call__(self, argument):
        for concrete in self.concrete:
            try:
                return concrete(argument)
            except TypeError:  # another signature: binding failed, nothing ran
                continue
        results = self.function(argument)
        if len(self.concrete) < self.MAX_SIGNATURES:
            self.concrete.append(self.function.get_concrete_function(argument))
        return results


def compiled(name: str, python_function: Callable, *bound, **options):
    """`tf.function(python_function, **options)` named `name`, with `bound` as its first arguments.

    Made from a `functools.partial`, so that TensorFlow's retracing warning counts this function's
    own traces: it keys its call statistics by a function's code, and the steps of every run
    share theirs, so in a process that runs several experiments (the benchmarks, the tests, a
    notebook) the first traces of each new run's steps read as one function retraced ("5 out of
    the last 5 calls ... triggered tf.function retracing"). A step that really retraces still warns.
    The name is what its graphs are called (`__inference_train_step_123` in a profile).
    """
    import tensorflow as tf

    function = functools.partial(python_function, *bound)
    function.__name__ = name
    return tf.function(function, **options)


def make_step_functions(strategy, model, optimizer, settings: StepSettings) -> StepFunctions:
    """Distributed train and evaluation steps, each returning the vector of sums (loss, correct, examples)."""
    import keras
    import tensorflow as tf

    global_batch_size, feature_scale = settings.global_batch_size, settings.feature_scale
    step_compute_s, steps_per_execution = settings.step_compute_s, settings.steps_per_execution

    per_example_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    compute_dtype = keras.mixed_precision.global_policy().compute_dtype

    def to_model_inputs(features):
        # The host sends features in the transfer dtype; normalising here keeps the bus narrow.
        return tf.cast(features, compute_dtype) * tf.cast(feature_scale, compute_dtype)

    def sums(labels, logits, losses):
        """The replica's (loss, correct, examples) sums as one float32 vector: one reduce, one read."""
        predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
        correct = tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.float32))
        loss_sum = tf.cast(tf.reduce_sum(losses), tf.float32)
        return tf.stack([loss_sum, correct, tf.cast(tf.shape(labels)[0], tf.float32)])

    def forward_backward_math(features, labels):
        with tf.GradientTape() as tape:
            logits = model(to_model_inputs(features), training=True)
            losses = per_example_loss(labels, logits)
            # Keras sums gradients over replicas, so each replica scales by the global batch.
            loss = tf.reduce_sum(losses) / global_batch_size
            # Identity unless a loss-scale optimizer guards float16 gradients.
            scaled_loss = optimizer.scale_loss(loss)
        return tape.gradient(scaled_loss, model.trainable_variables), sums(labels, logits, losses)

    # XLA compiles the math; the gradient all-reduce stays outside the compiled function.
    forward_backward = compiled("forward_backward", forward_backward_math, jit_compile=settings.jit_compile or None)

    def replica_train(features, labels):
        gradients, replica_sums = forward_backward(features, labels)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if step_compute_s:
            slept = tf.py_function(lambda: time.sleep(step_compute_s) or 0.0, [], tf.float32)
            slept = tf.ensure_shape(slept, [])  # a scalar, as the loop of train_execution needs
            replica_sums = replica_sums + slept  # a dependency on the sleep (it returns 0)
        return replica_sums

    def replica_evaluate(features, labels):
        logits = model(to_model_inputs(features), training=False)
        return sums(labels, logits, per_example_loss(labels, logits))

    def replica_empty(features, labels):
        return tf.zeros([3], tf.float32)

    def reduced_sums(replica_fn, batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_fn, args=batch), axis=None)

    def execution(iterator):
        totals = tf.zeros([3])
        for _ in tf.range(steps_per_execution):
            totals += reduced_sums(replica_train, next(iterator))
        return totals

    train_execution = compiled("train_execution", execution)

    direct = DirectCall if settings.direct_calls else (lambda function: function)
    return StepFunctions(
        train_step=direct(compiled("train_step", reduced_sums, replica_train)),
        evaluate_step=direct(compiled("evaluate_step", reduced_sums, replica_evaluate)),
        empty_step=direct(compiled("empty_step", reduced_sums, replica_empty)),
        train_execution=direct(train_execution) if steps_per_execution > 1 else None,
        steps_per_execution=steps_per_execution,
        read_each_step=not calls_return_when_done(),
    )


def calls_return_when_done() -> bool:
    """Whether a compiled call returns only once its work has finished, so that the call's duration
    is the step's without a read of its results: in a process with no GPU or TPU, under eager's
    synchronous execution (TensorFlow's default; checked: a 1.3 s step on two mirrored CPU
    replicas, then 0.04 ms to read its result). A GPU's or TPU's call returns once its work is
    queued: there the host reads every step's results, which waits for the step."""
    import tensorflow as tf

    accelerators = tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    return not accelerators and tf.config.experimental.get_synchronous_execution()


def evaluate(steps: StepFunctions, distributed_validation) -> Dict[str, float]:
    """Mean loss and accuracy over one pass of the distributed validation dataset ({} when it is empty)."""
    loss_sum = correct = num_examples = 0.0
    for batch in distributed_validation:
        batch_loss, batch_correct, batch_examples = read_sums(steps.evaluate_step(batch))
        loss_sum, correct, num_examples = loss_sum + batch_loss, correct + batch_correct, num_examples + batch_examples
    if not num_examples:
        return {}
    return {"val_loss": float(loss_sum / num_examples), "val_accuracy": float(correct / num_examples)}


def read_sums(sums) -> np.ndarray:
    """A step's vector of sums (loss, correct, examples) on the host: one read, which waits for the step."""
    return np.asarray(sums)


def read_results(records: Sequence[StepRecord]) -> np.ndarray:
    """The records' vectors of sums as one (steps, 3) array. A result still a tensor is read here
    and kept on its record as an array, so that the next hook to read it pays nothing: each step's
    results are read once, by whichever hook needs them first."""
    for record in records:
        if not isinstance(record.results, np.ndarray):
            record.results = np.asarray(record.results)
    return np.stack([record.results for record in records])


class NonFiniteLoss(RuntimeError):
    """Training diverged: the loss is NaN or infinite."""


class TerminateOnNaN(Hook):
    """Stop when a step's loss is NaN or infinite (Keras's TerminateOnNaN), naming the first such
    step: the run ends FAILED with the reason, instead of training on and reporting figures of a
    broken model. The losses are read every `CHECK_EVERY` steps and at each epoch's end, in one
    read (Keras checks after every call): a diverged run stops within that many steps."""

    follows_extra_steps = True
    CHECK_EVERY = 16

    def __init__(self) -> None:
        self.pending: List[Tuple[int, StepRecord]] = []  # steps not checked yet

    def on_step_end(self, step: int, record: StepRecord) -> None:
        self.pending.append((step, record))
        if len(self.pending) >= self.CHECK_EVERY:
            self.check()

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        self.check()

    def check(self) -> None:
        if not self.pending:
            return
        numbers, records = zip(*self.pending)
        self.pending = []
        loss_sums = read_results(records)[:, 0]
        for number, loss_sum in zip(numbers, loss_sums):
            if not math.isfinite(loss_sum):
                raise NonFiniteLoss(
                    f"the training loss became {loss_sum} at step {number}: training diverged; lower "
                    "train.learning_rate (or set train.terminate_on_nan=false to train on regardless)"
                )


class EpochMetrics(Hook):
    """Loss and accuracy of each epoch's training steps, then one validation pass: into the epoch's logs."""

    FOLD_EVERY = 1024  # steps' results held before they are read and summed

    def __init__(self, steps: StepFunctions, distributed_validation) -> None:
        self.steps = steps
        self.distributed_validation = distributed_validation
        self.sums = np.zeros(3)
        self.pending: List[StepRecord] = []  # the epoch's steps not summed yet
        self.last: Dict[str, float] = {}

    def on_epoch_begin(self, epoch: int) -> None:
        self.sums, self.pending = np.zeros(3), []

    def on_step_end(self, step: int, record: StepRecord) -> None:
        self.pending.append(record)
        if len(self.pending) >= self.FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        if self.pending:
            self.sums = self.sums + read_results(self.pending).sum(axis=0, dtype=np.float64)
            self.pending = []

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        self.fold()
        loss_sum, correct, num_examples = (float(value) for value in self.sums)
        logs.update({"loss": loss_sum / num_examples, "accuracy": correct / num_examples})
        logs.update(evaluate(self.steps, self.distributed_validation))
        self.last = dict(logs)


def train(
    steps: StepFunctions, train_iterator, distributed_validation, plan: StepPlan, hooks: Sequence[Hook] = ()
) -> Dict[str, float]:
    """Train for `plan.epochs` x `plan.steps_per_epoch` timed loop steps; returns the last epoch's metrics.

    Each loop step reads its results on the host, so its compute time is the step's on every
    replica. With `steps.train_execution`, a loop step is one execution of
    `steps.steps_per_execution` training steps: the loop's `next()` hands it the distributed
    iterator itself (no host fetch), and the execution takes its batches inside the graph.
    After each epoch, one pass over `distributed_validation`; `hooks` then see the epoch's
    metrics (loss, accuracy, val_loss, val_accuracy) in `on_epoch_end`'s logs. `train_iterator`
    is an iterator over the distributed training dataset; the caller keeps it, warm, for what it
    measures after training.
    """
    metrics = EpochMetrics(steps, distributed_validation)
    loop_iterator, step = loop_step(steps, train_iterator)
    timed_loop(loop_iterator, step, plan.epochs, plan.steps_per_epoch, [metrics, *hooks], plan.first_epoch)
    return metrics.last


def loop_step(steps: StepFunctions, train_iterator):
    """(what the timed loop calls `next()` on, the step it calls with what that returns) for training:
    a distributed batch and the train step, or, with N steps per execution, the iterator itself
    and the N-step execution. Each returns when its work is done: it reads its results on the host
    where a call returns earlier (`steps.read_each_step`), else returns them as a tensor."""
    read = read_sums if steps.read_each_step else (lambda sums: sums)
    if steps.train_execution is None:
        return train_iterator, lambda batch: read(steps.train_step(batch))
    return itertools.repeat(train_iterator), lambda iterator: read(steps.train_execution(iterator))
