"""mode=train under strategy=parameter_server: steps scheduled on the workers by a ClusterCoordinator.

Steps are asynchronous: the chief schedules closures, each worker runs one at a time as they
come, and the chief learns of them only when it joins. So the chief cannot time a step around
`next()` and the step call as bwopt.loop does; each closure times itself, on its worker, with
`tf.timestamp()` (the worker host's clock, in seconds):

- per closure: input wait = the worker's `get_next` on its own iterator; compute = the train
  step until its sums exist (gradients applied on the parameter servers); step time = their sum.
  These records go, in the order the steps were scheduled, through the run's hooks (step timer,
  epoch metrics, progress, stop check), so step-time percentiles, jitter, the input-wait fraction
  and the verdict keep their meaning: they describe one worker's step.
- across workers: steps overlap, so the run's throughput is not examples / the sum of step times
  but examples / the wall time the timed closures spanned: in each epoch, from the earliest start
  to the latest end among its timed closures (on one host exact; across hosts it assumes
  synchronised clocks, e.g. NTP, whose ms error is small against an epoch), summed over epochs.
  `async_timed_wall_s` carries it and `overlapping_steps_figures` applies it;
  `closure_throughput_examples_per_s` keeps the per-closure rate (examples / summed step time),
  and `worker_busy_fraction` = summed step time / (span x workers): the rest of the workers' time
  goes to the coordinator's dispatch and the RPCs between closures (on 2 shared cores about half).
- per worker: `worker<i>/num_timed_steps`, `worker<i>/throughput_examples_per_s` (its timed examples /
  the same span), `worker<i>/input_wait_fraction`, `worker<i>/step_time_p50_s`.

Each worker reads the whole training split in its own order: ParameterServerStrategy gives every
worker the same input context (one pipeline of one), as TensorFlow's guide describes; a step is
one global batch.
"""

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List

import numpy as np

from bwopt.loop import HookList, StepRecord

if TYPE_CHECKING:
    from bwopt.run import Run

# The measurement that carries the wall time the timed closures spanned together.
ASYNC_WALL_KEY = "async_timed_wall_s"


def run_coordinated_training(run: "Run") -> Dict[str, float]:
    """mode=train for parameter_server: schedule every step, join, replay the closures' records."""
    import tensorflow as tf

    from bwopt.signals import STOP
    from bwopt.train import EpochMetrics

    config, strategy, plan = run.config, run.strategy, run.input_plan.steps
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    run.build_model()
    steps = run.step_functions()
    per_worker_dataset = coordinator.create_per_worker_dataset(run.distributed_dataset(training=True))
    per_worker_iterator = iter(per_worker_dataset)
    worker_ids = worker_indices(coordinator)

    @tf.function
    def closure(iterator, worker_id):
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch)):
            fetched = tf.timestamp()
        sums = steps.train_step(batch)
        with tf.control_dependencies(list(sums)):
            finished = tf.timestamp()
        return sums, started, fetched, finished, worker_id

    # Validation runs inline on the chief, on global batches, reading the variables from the servers;
    # TensorFlow warns at every such call that it is not scheduled, which is meant here.
    logging.getLogger("tensorflow").addFilter(lambda record: "ClusterCoordinator.schedule" not in record.getMessage())
    metrics = EpochMetrics(steps, run.inputs.dataset(False))
    hooks = HookList([metrics, *run.loop_hooks()])
    join_every = config.strategy.steps_per_join or plan.steps_per_epoch
    closures: List[tuple] = []
    try:
        for epoch in range(plan.epochs):
            hooks.on_epoch_begin(epoch)
            scheduled = []
            for index in range(plan.steps_per_epoch):
                scheduled.append(coordinator.schedule(closure, args=(per_worker_iterator, worker_ids)))
                if (index + 1) % join_every == 0:
                    coordinator.join()
                STOP.check()
            coordinator.join()
            for index, remote in enumerate(scheduled):
                sums, started, fetched, finished, worker = remote.fetch()
                number = epoch * plan.steps_per_epoch + index
                closures.append((number, float(started), float(fetched), float(finished), int(worker)))
                hooks.on_step_begin(number)
                hooks.on_step_end(number, StepRecord(float(fetched - started), float(finished - fetched), sums))
            hooks.on_epoch_end(epoch, {})
    finally:
        hooks.on_loop_end()
    return asynchronous_figures(closures, plan, config.train.global_batch_size)


def worker_indices(coordinator):
    """A PerWorkerValues holding each worker's index, which `schedule` hands to the closure on that worker.

    TensorFlow creates PerWorkerValues only for datasets and iterators; one resource per worker,
    each a function returning its own index, gives the same structure (the coordinator's private
    `_cluster.workers` lists the workers in index order, as its own per-worker resources use them).
    """
    import tensorflow as tf
    from tensorflow.python.distribute.coordinator.values import PerWorkerValues

    def index_of(index: int):
        return tf.function(lambda: tf.constant(index))

    workers = coordinator._cluster.workers
    return PerWorkerValues(tuple(worker.create_resource(index_of(i)) for i, worker in enumerate(workers)))


def asynchronous_figures(closures: List[tuple], plan, examples_per_step: int) -> Dict[str, float]:
    """The span of the timed closures (their wall time together) and the per-worker figures.

    `closures`: (step number, started, fetched, finished, worker index) per closure, worker clock.
    """
    timed = set(plan.timed(len(closures)))
    kept = [closure for closure in closures if closure[0] in timed]
    if not kept:
        return {}
    span = 0.0
    for epoch in range(plan.epochs):
        in_epoch = [c for c in kept if epoch * plan.steps_per_epoch <= c[0] < (epoch + 1) * plan.steps_per_epoch]
        if in_epoch:
            span += max(c[3] for c in in_epoch) - min(c[1] for c in in_epoch)
    step_s = sum(c[3] - c[1] for c in kept)
    num_workers = len({c[4] for c in kept})
    figures = {
        ASYNC_WALL_KEY: span,
        "closure_throughput_examples_per_s": len(kept) * examples_per_step / step_s,
        # Time the workers spent inside closures over what they had; the rest is the coordinator's
        # dispatch and the RPCs between closures.
        "worker_busy_fraction": step_s / (span * num_workers),
    }
    for worker in sorted({c[4] for c in kept}):
        mine = [c for c in kept if c[4] == worker]
        wait = sum(c[2] - c[1] for c in mine)
        total = sum(c[3] - c[1] for c in mine)
        figures[f"worker{worker}/num_timed_steps"] = len(mine)
        figures[f"worker{worker}/throughput_examples_per_s"] = len(mine) * examples_per_step / span
        figures[f"worker{worker}/input_wait_fraction"] = wait / total
        figures[f"worker{worker}/step_time_p50_s"] = float(np.median([c[3] - c[1] for c in mine]))
    return figures


def overlapping_steps_figures(figures, measurements: Dict[str, float]):
    """TimingFigures of overlapping (asynchronous) steps: throughput over the wall time they spanned.

    Step-time percentiles, jitter and the input-wait fraction stay per step; `timed_wall_s` and
    the throughputs use `measurements[ASYNC_WALL_KEY]` (see the module docstring). Unchanged
    when the mode measured no span (synchronous steps run back to back).
    """
    wall_s = measurements.get(ASYNC_WALL_KEY)
    if figures is None or not wall_s:
        return figures
    scale = figures.timed_wall_s / wall_s
    return replace(
        figures,
        timed_wall_s=wall_s,
        throughput_examples_per_s=figures.throughput_examples_per_s * scale,
        throughput_bytes_per_s=figures.throughput_bytes_per_s * scale,
    )
