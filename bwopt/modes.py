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
    if run.config.strategy.name == "parameter_server":  # asynchronous steps, timed by each closure
        from bwopt.coordinated import run_coordinated_training

        return run_coordinated_training(run)
    from bwopt.strategies import distribute_input
    from bwopt.train import train

    config = run.config
    model, _ = run.build_model()
    run.restore_checkpoint()  # a run resumed after a stop: its weights, from its last stop
    steps = run.step_functions(config.train.steps_per_execution)
    train_iterator = iter(run.distributed_dataset(training=True))
    train(steps, train_iterator, run.distributed_dataset(training=False), run.input_plan.steps, run.loop_hooks())
    # After training and its epoch metrics: the references and the ceilings train on their batches.
    ready_iterator = iter(distribute_input(run.strategy, config.pipeline.distribute, run.inputs.ready_dataset))
    figures: Dict[str, float] = measure_host_references(steps, ready_iterator).metrics()
    if config.measure.ceilings:
        figures.update(measure_ceilings(run, steps, train_iterator, ready_iterator))
    if config.measure.inference_batch_sizes:
        figures.update(measure_inference(run, model))
    return figures


def measure_host_references(steps, ready_iterator):
    """The per-call costs that split the input wait (bwopt.measure.timing), on batches always ready."""
    from bwopt.measure import HostReferences, dispatch_overhead_s, fetch_overhead_s, ready_execution_s

    dispatch = dispatch_overhead_s(steps.empty_step, next(ready_iterator))
    if steps.train_execution is None:
        return HostReferences(dispatch, fetch_overhead_s=fetch_overhead_s(ready_iterator))
    return HostReferences(dispatch, ready_execution_s=ready_execution_s(steps.train_execution, ready_iterator))


def measure_ceilings(run: "Run", steps, train_iterator, ready_iterator) -> Dict[str, float]:
    """Both ceilings on the training pipeline as training left it (warm, caches filled), each in
    `measure.ceiling_blocks` blocks (`ceiling_steps` steps in all): every compute block first, then
    every input block. Alternating them would time each compute block while the pipeline's threads
    refill the buffers the input block before it drained, on the same cores (the compute ceiling
    read half its value so with an autotuned prefetch on 2 cores); after training the buffers are
    full and the pipeline idle, so the compute blocks have the machine to themselves.

    With `train.steps_per_execution` N > 1 the compute ceiling times the N-step execution on an
    iterator over one cached batch (batches always ready), so it includes the in-graph fetch.
    """
    from bwopt.measure import Ceilings, compute_ceiling, input_ceiling
    from bwopt.strategies import place_on_replica_devices

    config = run.config
    batch, num_blocks = config.train.global_batch_size, config.measure.ceiling_blocks
    per_block = config.measure.ceiling_steps // num_blocks
    per_execution = config.train.steps_per_execution
    if steps.train_execution is None:
        on_devices = place_on_replica_devices(run.strategy, next(ready_iterator), run.replica_devices)
        step, argument, compute_steps = steps.train_step, on_devices, per_block
    else:
        step, argument, compute_steps = steps.train_execution, ready_iterator, max(2, per_block // per_execution)
    compute_blocks, input_blocks, input_bytes_blocks = [], [], []
    for block in range(num_blocks):
        warmup = min(config.train.warmup_steps, compute_steps) if block == 0 else 0
        compute_blocks.append(compute_ceiling(step, argument, compute_steps, warmup, batch * per_execution))
    for block in range(num_blocks):
        drain = batches_to_drain(config, per_block, first_block=block == 0)
        examples_per_s, bytes_per_s = input_ceiling(
            train_iterator, per_block, drain, batch, batch * run.input_plan.bytes_per_example
        )
        input_blocks.append(examples_per_s)
        input_bytes_blocks.append(bytes_per_s)
    return Ceilings.from_blocks(compute_blocks, input_blocks, input_bytes_blocks).metrics()


def batches_to_drain(config, block_steps: int, first_block: bool) -> int:
    """Batches to take, untimed, before timing one input-ceiling block on the training iterator.

    During training, the validation pass and every compute block the pipeline buffered batches
    (prefetch, the per-replica buffer, the tf.data service's own buffers); timing them would
    count batches made earlier. A fixed prefetch depth is known; an autotuned one or the
    service's is not, so then as many batches as the block times are drained first. The first
    block also drains `train.warmup_steps` more.
    """
    from bwopt.schema import AUTOTUNE

    pipeline = config.pipeline
    warmup = config.train.warmup_steps if first_block else 0
    if pipeline.prefetch == AUTOTUNE or pipeline.service.mode != "off":
        return warmup + block_steps
    return warmup + pipeline.prefetch + pipeline.distribute.per_replica_buffer_size


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
