"""`run()` picks and drives a mode; the three modes a run can be in.

    with Run(config, output_dir, resolved, overrides) as current:  # workload prepared, tracking started
        current.build()                                             # inputs, model, steps; checkpoint restored
        current.mode_figures = MODES[config.mode](current.workload, current.loop_hooks())
    current.summary                                                 # made and recorded on leaving

Each mode is a function of the built `Workload` (bwopt.workload) and the run's loop hooks that
returns the figures it measured beyond the run's own step timer and epoch log:

train: the timed training loop, then the ceilings and inference when asked;
input: the distributed training dataset iterated alone (the input ceiling);
inference: forward passes of a freshly built model.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Dict, Sequence

from bwopt.loop import Hook
from bwopt.run import Run
from bwopt.signals import STOP, StopCheck

if TYPE_CHECKING:
    from bwopt.schema import Config
    from bwopt.summary import Summary
    from bwopt.workload import Workload


def run(config: "Config", output_dir: Path, resolved: dict, overrides: Sequence[str] = ()) -> "Summary":
    """Run one experiment; the MLflow run ends FINISHED, FAILED or KILLED with what was measured.

    `overrides` are the command line's `key=value`s: they name the MLflow run.
    """
    with Run(config, output_dir, resolved, overrides) as current:
        current.build()
        STOP.check()  # a signal during set-up
        current.mode_figures = run_mode(current.workload, current.loop_hooks())
        STOP.check()  # a signal during the last step of a deferred loop
    return current.summary


def run_mode(workload: "Workload", hooks: Sequence[Hook]) -> Dict[str, float]:
    """The mode's figures; a TensorFlow error from the user's data files becomes a DataError naming the file."""
    from bwopt.data.diagnose import diagnose

    try:
        return MODES[workload.config.mode](workload, hooks)
    except Exception as error:
        data_error = diagnose(workload.source, workload.config.data.name, error)
        if data_error is None:
            raise
        raise data_error from error


def run_training(workload: "Workload", hooks: Sequence[Hook]) -> Dict[str, float]:
    """mode=train: the timed training loop, then the ceilings and inference when asked."""
    config = workload.config
    if config.strategy.name == "parameter_server":  # asynchronous steps, timed by each closure
        from bwopt.coordinated import run_coordinated_training

        with STOP.deferred():
            return run_coordinated_training(workload, hooks)
    from bwopt.train import loop_step, train

    steps = workload.steps
    train_iterator = iter(workload.distributed_dataset(training=True))
    with STOP.deferred():  # loops over TensorFlow iterators: a signal stops them between two steps
        train(steps, train_iterator, workload.distributed_dataset(training=False), workload.input_plan.steps, hooks)
        fill_timed_window(workload, hooks, *loop_step(steps, train_iterator))
    # After training and its epoch metrics: the references and the ceilings train on their batches.
    figures: Dict[str, float] = {}
    try:
        ready_iterator = workload.ready_batches()
        with STOP.deferred():
            figures.update(measure_host_references(steps, ready_iterator).metrics())
            STOP.check()
            if config.measure.ceilings:
                figures.update(measure_ceilings(workload, train_iterator, ready_iterator))
        if config.measure.inference_batch_sizes:
            figures.update(measure_inference(workload))
    except KeyboardInterrupt as stop:  # the run ends KILLED with what was measured so far
        stop.measured = figures
        raise
    return figures


def fill_timed_window(workload: "Workload", hooks: Sequence[Hook], loop_iterator, step) -> None:
    """Extra timed steps after the epochs until the timed window lasts `measure.min_timed_s`.

    The epochs stay as configured (their metrics are logged before); the extra steps continue
    on the same iterator with the same step, seen only by the hooks that follow extra steps (the
    step timer, the stop and NaN checks), and the plan counts them as timed. Not across processes
    (multi_worker_mirrored): each worker would count its own extra steps, and collective steps
    must be the same number on every worker.
    """
    from dataclasses import replace

    from bwopt.schema import MULTI_PROCESS_STRATEGIES

    if workload.config.strategy.name in MULTI_PROCESS_STRATEGIES:
        return
    from bwopt.loop import extra_timed_steps
    from bwopt.measure import StepTimer
    from bwopt.measure.plan import extra_steps_needed

    timer = next(hook for hook in hooks if isinstance(hook, StepTimer))
    min_timed_s = workload.config.measure.min_timed_s
    for _ in range(10):  # an estimate falls short when the steps speed up: top up until the window is full
        plan = workload.input_plan.steps
        extra = extra_steps_needed(timer, plan, min_timed_s)
        if not extra:
            return
        if plan.extra_steps == 0:
            print(
                f"bwopt: timing {extra:,} more steps for a window of {min_timed_s:g} s (measure.min_timed_s)",
                flush=True,
            )
        first = plan.num_steps + plan.extra_steps
        workload.input_plan.steps = replace(plan, extra_steps=plan.extra_steps + extra)
        extra_timed_steps(loop_iterator, step, range(first, first + extra), hooks)


def measure_host_references(steps, ready_iterator):
    """The per-call costs that split the input wait (bwopt.measure.timing), on batches always ready."""
    from bwopt.measure import HostReferences, dispatch_overhead_s, fetch_overhead_s, ready_execution_s

    read = steps.read_each_step  # timed as the loop times a step: with its read, or the call alone
    measured = {"dispatch_overhead_s": dispatch_overhead_s(steps.empty_step, next(ready_iterator), read=read)}
    if steps.train_execution is None:
        measured["fetch_overhead_s"] = fetch_overhead_s(ready_iterator)
    else:
        measured["ready_execution_s"] = ready_execution_s(steps.train_execution, ready_iterator, read=read)
    ranges = {name: (low, high) for name, (_, low, high) in measured.items()}
    return HostReferences(**{name: median for name, (median, _, _) in measured.items()}, ranges=ranges)


def measure_ceilings(workload: "Workload", train_iterator, ready_iterator) -> Dict[str, float]:
    """Both ceilings on the training pipeline as training left it (warm, caches filled), each in
    `measure.ceiling_blocks` blocks (`ceiling_steps` steps in all): every compute block first, then
    every input block. Alternating them would time each compute block while the pipeline's threads
    refill the buffers the input block before it drained, on the same cores (the compute ceiling
    read half its value so with an autotuned prefetch on 2 cores); after training the buffers are
    full and the pipeline idle, so the compute blocks have the machine to themselves.

    With `train.steps_per_execution` N > 1 the compute ceiling times the N-step execution on an
    iterator over one cached batch (batches always ready), so it includes the in-graph fetch.
    """
    from bwopt.measure import Ceilings, CpuClock, compute_ceiling, input_ceiling
    from bwopt.measure.host import available_cores
    from bwopt.strategies import place_on_replica_devices

    config, steps = workload.config, workload.steps
    batch, num_blocks = config.train.global_batch_size, config.measure.ceiling_blocks
    per_block = config.measure.ceiling_steps // num_blocks
    per_execution = config.train.steps_per_execution
    if steps.train_execution is None:
        on_devices = place_on_replica_devices(workload.strategy, next(ready_iterator), workload.replica_devices)
        step, argument, compute_steps = steps.train_step, on_devices, per_block
    else:
        step, argument, compute_steps = steps.train_execution, ready_iterator, max(2, per_block // per_execution)
    compute_blocks, input_blocks, input_bytes_blocks, compute_cpu, input_cpu = [], [], [], [], []
    stop = StopCheck()  # a signal stops a block between two of its steps
    for block in range(num_blocks):
        warmup = min(config.train.warmup_steps, compute_steps) if block == 0 else 0
        clock = CpuClock(warmup, warmup + compute_steps - 1)
        examples = batch * per_execution
        hooks = [stop, clock]
        compute_blocks.append(
            compute_ceiling(step, argument, compute_steps, warmup, examples, hooks, read=steps.read_each_step)
        )
        compute_cpu.append(clock.cpu_s / (compute_steps * examples))
    for block in range(num_blocks):
        drain = batches_to_drain(config, per_block, first_block=block == 0)
        clock = CpuClock(drain, drain + per_block - 1)
        examples_per_s, bytes_per_s = input_ceiling(
            train_iterator, per_block, drain, batch, batch * workload.input_plan.bytes_per_example, [stop, clock]
        )
        input_blocks.append(examples_per_s)
        input_bytes_blocks.append(bytes_per_s)
        input_cpu.append(clock.cpu_s / (per_block * batch))
    return Ceilings.from_blocks(
        compute_blocks, input_blocks, input_bytes_blocks, compute_cpu, input_cpu, cores=available_cores()
    ).metrics()


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


def measure_inference(workload: "Workload") -> Dict[str, float]:
    from bwopt.measure.inference import measure_inference as measure

    config, source = workload.config, workload.source
    with workload.strategy.scope():
        results = measure(
            workload.model,
            source.feature_shape,
            config.pipeline.transfer_dtype,
            config.measure.inference_batch_sizes,
            config.measure.inference_batches,
            config.measure.inference_warmup_batches,
            feature_scale=source.feature_scale,
        )
    return {key: value for figures in results for key, value in figures.metrics().items()}


def run_input_only(workload: "Workload", hooks: Sequence[Hook]) -> Dict[str, float]:
    """mode=input: iterate the distributed training dataset alone, timed like training steps.

    Input wait is the time in `next()`; "compute" is only the wait until every per-replica
    tensor is materialised (`wait_for_batch`). Throughput is then the input ceiling of this pipeline.
    """
    from bwopt.loop import timed_loop
    from bwopt.measure import wait_for_batch

    steps = workload.input_plan.steps
    iterator = iter(workload.distributed_dataset(training=True))
    with STOP.deferred():
        timed_loop(iterator, wait_for_batch, steps.epochs, steps.steps_per_epoch, hooks)
        fill_timed_window(workload, hooks, iterator, wait_for_batch)
    return {}


def run_inference_only(workload: "Workload", hooks: Sequence[Hook]) -> Dict[str, float]:
    """mode=inference: forward passes of a freshly built model at measure.inference_batch_sizes."""
    return measure_inference(workload)


# Keyed by bwopt.schema.MODES.
MODES = {"train": run_training, "input": run_input_only, "inference": run_inference_only}
