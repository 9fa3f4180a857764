"""The three modes a run can be in. Each is a function of the `Run` (bwopt.run), after its
`set_up`, that returns the figures it measured beyond the run's own step timer and epoch log.

train: the timed training loop, then the ceilings and inference when asked;
input: the distributed training dataset iterated alone (the input ceiling);
inference: forward passes of a freshly built model.
"""

from typing import TYPE_CHECKING, Dict

if TYPE_CHECKING:
    from bwopt.run import Run


def run_training(run: "Run") -> Dict[str, float]:
    """mode=train: the timed training loop, then the ceilings and inference when asked."""
    from bwopt.train import make_step_functions, train

    config = run.config
    model, optimizer = run.build_model()
    steps = make_step_functions(
        run.strategy,
        model,
        optimizer,
        config.train.global_batch_size,
        run.source.feature_scale,
        config.device.jit_compile,
        step_compute_s=run.source.step_compute_s,
    )
    train_iterator = iter(run.distributed_dataset(training=True))
    train(steps, train_iterator, run.distributed_dataset(training=False), run.input_plan.steps, run.loop_hooks())
    figures: Dict[str, float] = {}
    if config.measure.ceilings:
        figures.update(measure_ceilings(run, steps, train_iterator))
    if config.measure.inference_batch_sizes:
        figures.update(measure_inference(run, model))
    return figures


def measure_ceilings(run: "Run", steps, train_iterator) -> Dict[str, float]:
    """Both ceilings on the training pipeline as training left it: warm, caches filled."""
    from bwopt.measure import Ceilings, compute_ceiling, input_ceiling
    from bwopt.strategies import place_on_replica_devices

    config = run.config
    batch, num_steps = config.train.global_batch_size, config.measure.ceiling_steps
    input_examples_per_s, input_bytes_per_s = input_ceiling(
        train_iterator, num_steps, batches_to_drain(config), batch, batch * run.input_plan.bytes_per_example
    )
    on_devices = place_on_replica_devices(run.strategy, next(train_iterator), run.replica_devices)
    warmup = min(config.train.warmup_steps, num_steps)
    ceilings = Ceilings(
        compute_examples_per_s=compute_ceiling(steps.train_step, on_devices, num_steps, warmup, batch),
        input_examples_per_s=input_examples_per_s,
        input_bytes_per_s=input_bytes_per_s,
    )
    return ceilings.metrics()


def batches_to_drain(config) -> int:
    """Batches to take, untimed, before timing the input ceiling on the training iterator.

    During training and the last validation pass the pipeline buffered batches (prefetch, the
    per-replica buffer, the tf.data service's own buffers); timing them would count batches made
    earlier. A fixed prefetch depth is known; an autotuned one or the service's is not, so then
    as many batches as will be timed are drained first.
    """
    from bwopt.schema import AUTOTUNE

    pipeline = config.pipeline
    if pipeline.prefetch == AUTOTUNE or pipeline.service.mode != "off":
        return config.train.warmup_steps + config.measure.ceiling_steps
    return config.train.warmup_steps + pipeline.prefetch + pipeline.distribute.per_replica_buffer_size


def measure_inference(run: "Run", model) -> Dict[str, float]:
    from bwopt.measure.inference import measure_inference as measure

    config, source = run.config, run.source
    with run.strategy.scope():
        results = measure(
            model,
            source.feature_shape,
            config.pipeline.transfer_dtype,
            config.measure.inference_batch_sizes,
            config.measure.inference_batches,
            config.measure.inference_warmup_batches,
            feature_scale=source.feature_scale,
        )
    return {key: value for figures in results for key, value in figures.metrics().items()}


def run_input_only(run: "Run") -> Dict[str, float]:
    """mode=input: iterate the distributed training dataset alone, timed like training steps.

    Input wait is the time in `next()`; "compute" is only the wait until every per-replica
    tensor is materialised (`wait_for_batch`). Throughput is then the input ceiling of this pipeline.
    """
    from bwopt.loop import timed_loop
    from bwopt.measure import wait_for_batch

    steps = run.input_plan.steps
    iterator = iter(run.distributed_dataset(training=True))
    timed_loop(iterator, wait_for_batch, steps.epochs, steps.steps_per_epoch, run.loop_hooks())
    return {}


def run_inference_only(run: "Run") -> Dict[str, float]:
    """mode=inference: forward passes of a freshly built model at measure.inference_batch_sizes."""
    model, _ = run.build_model()
    return measure_inference(run, model)


# Keyed by bwopt.schema.MODES.
MODES = {"train": run_training, "input": run_input_only, "inference": run_inference_only}
