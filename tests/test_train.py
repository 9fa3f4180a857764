"""The compiled train and evaluation steps, and epochs of them, on one device and on two replicas."""

import numpy as np
import pytest


def build(strategy, global_batch_size, direct_calls=True):
    import keras

    from bwopt.train import StepSettings, make_step_functions

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    settings = StepSettings(global_batch_size, direct_calls=direct_calls)
    return model, make_step_functions(strategy, model, optimizer, settings)


def batches(global_batch_size, num_batches):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    features = rng.standard_normal((global_batch_size * num_batches, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int32) + (features[:, 1] > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(global_batch_size, drop_remainder=True)


def test_evaluation_counts_the_examples_and_matches_the_model_by_hand():
    import keras
    import tensorflow as tf

    from bwopt.train import evaluate

    strategy = tf.distribute.get_strategy()
    model, steps = build(strategy, 16)
    dataset = batches(16, 3)
    metrics = evaluate(steps, dataset)
    features = np.concatenate([f.numpy() for f, _ in dataset])
    labels = np.concatenate([label.numpy() for _, label in dataset])
    logits = model(features).numpy()
    losses = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(labels, logits)
    assert metrics["val_loss"] == pytest.approx(float(np.mean(losses)), rel=1e-5)
    assert metrics["val_accuracy"] == pytest.approx(float(np.mean(logits.argmax(-1) == labels)))


def test_steps_called_through_their_concrete_functions_train_the_same_and_take_any_batch_size():
    import tensorflow as tf

    from bwopt.train import DirectCall, evaluate, read_sums

    strategy = tf.distribute.get_strategy()
    trained = {}
    for direct in (False, True):
        model, steps = build(strategy, 16, direct_calls=direct)
        assert isinstance(steps.train_step, DirectCall) == direct
        sums = [read_sums(steps.train_step(batch)) for batch in batches(16, 6)]
        trained[direct] = (np.array(sums), [weight.numpy() for weight in model.weights])
    (direct_sums, direct_weights), (sums, weights) = trained[True], trained[False]
    np.testing.assert_array_equal(direct_sums, sums)  # the same graph, the same numbers
    for direct_weight, weight in zip(direct_weights, weights):
        np.testing.assert_array_equal(direct_weight, weight)
    # `steps` (the last built) calls directly. Validation batches of 16 and a last one of 8,
    # twice: each signature traced once and kept.
    validation = batches(8, 5)
    unbatched = validation.unbatch().batch(16)  # 16, 16, 8
    first, second = evaluate(steps, unbatched), evaluate(steps, unbatched)
    assert first == second and len(steps.evaluate_step.concrete) == 2
    assert evaluate(steps, validation)["val_loss"] == pytest.approx(first["val_loss"], rel=1e-6)


@pytest.mark.slow  # eight builds and their traces: seconds
def test_runs_in_one_process_trace_their_steps_without_the_retracing_warning_that_a_real_retrace_gets():
    """TensorFlow counts traces by a function's code; each run's steps are new functions of the
    same code, so runs in one process (benchmarks, a notebook) once read as a step retraced."""
    import io
    import logging

    import tensorflow as tf

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    tf.get_logger().addHandler(handler)
    try:
        strategy = tf.distribute.get_strategy()
        for _ in range(8):  # the warning comes at the 5th traced call
            _, steps = build(strategy, 8)
            for batch in batches(8, 2):
                steps.train_step(batch), steps.evaluate_step(batch), steps.empty_step(batch)
        assert "triggered tf.function retracing" not in log.getvalue()
        graph_name = steps.train_step.function.get_concrete_function(batch).name.decode()
        assert graph_name.startswith("__inference_train_step_"), graph_name  # how a profile names it
        for size in range(1, 12):  # one step, eleven batch sizes: retraced, and told so
            steps.evaluate_step(next(iter(batches(size, 1))))
        assert "triggered tf.function retracing" in log.getvalue()
    finally:
        tf.get_logger().removeHandler(handler)


def test_two_replicas_sum_to_the_global_batch(devices):
    import tensorflow as tf

    from bwopt.train import read_sums

    # Reduction to one device: no collective ops, whose keys a second strategy in one process may reuse.
    cross_device_ops = tf.distribute.ReductionToOneDevice()
    strategy = tf.distribute.MirroredStrategy(devices.device_names[:2], cross_device_ops=cross_device_ops)
    _, steps = build(strategy, 16)
    batch = next(iter(strategy.experimental_distribute_dataset(batches(16, 1))))
    loss_sum, correct, num_examples = read_sums(steps.train_step(batch))
    assert num_examples == 16 and 0 <= correct <= 16 and loss_sum > 0


def test_train_runs_the_planned_epochs_and_the_loss_falls():
    import tensorflow as tf

    from bwopt.measure import StepPlan, StepTimer
    from bwopt.train import train

    strategy = tf.distribute.get_strategy()
    _, steps = build(strategy, 16)
    timer, epochs = StepTimer(), []

    class Epochs:
        def on_epoch_end(self, epoch, logs):
            epochs.append(dict(logs))

    from bwopt.loop import Hook

    hook = type("EpochsHook", (Hook,), {"on_epoch_end": Epochs.on_epoch_end})()
    last = train(steps, iter(batches(16, 8).repeat()), batches(16, 4), StepPlan(3, 8, 2), [timer, hook])
    assert timer.num_steps == 24 and len(epochs) == 3 and epochs[-1] == last
    assert epochs[-1]["loss"] < epochs[0]["loss"]


def test_a_diverging_run_stops_at_the_first_nan_loss_and_ends_failed(run_experiment, mlflow_client):
    from bwopt.train import NonFiniteLoss

    with pytest.raises(NonFiniteLoss, match=r"the training loss became (nan|inf) at step \d+: training diverged"):
        run_experiment("train.optimizer=sgd", "train.learning_rate=1e9", "train.epochs=5", experiment="diverging")
    experiment = mlflow_client.get_experiment_by_name("diverging")
    (run,) = mlflow_client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED" and "training diverged" in run.data.tags["bwopt.end_reason"]
    # It stopped at once: not five epochs of NaN.
    assert len(mlflow_client.get_metric_history(run.info.run_id, "loss")) <= 1


def test_on_cpu_the_loop_leaves_results_unread_and_the_epoch_metrics_are_those_of_a_read_every_step():
    import dataclasses

    import tensorflow as tf

    from bwopt.measure import StepPlan
    from bwopt.train import calls_return_when_done, loop_step, train

    assert calls_return_when_done()  # this machine has no GPU: a compiled call returns when done
    strategy = tf.distribute.get_strategy()
    epochs = {}
    for read_each_step in (True, False):
        _, steps = build(strategy, 16)  # the same seed: the same model, the same examples
        steps = dataclasses.replace(steps, read_each_step=read_each_step)
        _, step = loop_step(steps, None)
        batch = next(iter(batches(16, 1)))
        assert isinstance(step(batch), np.ndarray) == read_each_step
        _, steps = build(strategy, 16)
        steps = dataclasses.replace(steps, read_each_step=read_each_step)
        epochs[read_each_step] = train(steps, iter(batches(16, 8).repeat()), batches(16, 4), StepPlan(2, 8, 2))
    assert epochs[False] == pytest.approx(epochs[True], rel=1e-6)


def test_the_nan_check_reads_losses_in_batches_and_names_the_first_bad_step():
    import tensorflow as tf

    from bwopt.loop import StepRecord
    from bwopt.train import NonFiniteLoss, TerminateOnNaN

    check = TerminateOnNaN()
    losses = [1.0] * 20 + [float("nan"), float("inf")] + [1.0] * 3
    for step, loss in enumerate(losses[:20]):
        check.on_step_end(step, StepRecord(0.0, 0.0, tf.constant([loss, 1.0, 1.0])))
    assert check.pending == [(16 + n, check.pending[n][1]) for n in range(4)]  # 16 read at once, 4 held
    for step, loss in enumerate(losses[20:], start=20):
        check.on_step_end(step, StepRecord(0.0, 0.0, tf.constant([loss, 1.0, 1.0])))
    with pytest.raises(NonFiniteLoss, match="became nan at step 20"):
        check.on_epoch_end(0, {})
