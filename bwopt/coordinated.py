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
  They go through `bwopt.loop.drive`, the same call of the hooks as the timed loop's.
- across workers: steps overlap, so the run's throughput is examples / the wall time the timed
  closures spanned (`bwopt.measure.overlap`); `worker_busy_fraction` is below 1 by the
  coordinator's dispatch and the RPCs between closures (on 2 shared cores about half).
- per worker: `worker<i>/num_timed_steps`, `worker<i>/throughput_examples_per_s` (its timed examples /
  the same span), `worker<i>/input_wait_fraction`, `worker<i>/step_time_p50_s`.

Each worker reads the whole training split in its own order: ParameterServerStrategy gives every
worker the same input context (one pipeline of one), as TensorFlow's guide describes; a step is
one global batch.
"""

import logging
from typing import TYPE_CHECKING, Dict, List, Sequence

from bwopt.loop import Hook, StepRecord, drive
from bwopt.measure.overlap import asynchronous_figures

if TYPE_CHECKING:
    from bwopt.workload import Workload


def run_coordinated_training(workload: "Workload", hooks: Sequence[Hook]) -> Dict[str, float]:
    """mode=train for parameter_server: schedule each epoch's steps, join, replay the closures' records."""
    import tensorflow as tf

    from bwopt.signals import STOP
    from bwopt.train import EpochMetrics

    config, plan, steps = workload.config, workload.input_plan.steps, workload.steps
    coordinator = tf.distribute.coordinator.ClusterCoordinator(workload.strategy)
    per_worker_dataset = coordinator.create_per_worker_dataset(workload.distributed_dataset(training=True))
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
        with tf.control_dependencies([sums]):
            finished = tf.timestamp()
        return sums, started, fetched, finished, worker_id

    join_every = config.strategy.steps_per_join or plan.steps_per_epoch
    closures: List[tuple] = []

    def scheduled_steps(epoch: int, hook: Hook):
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
            hook.on_step_begin(number)
            yield number, StepRecord(float(fetched - started), float(finished - fetched), sums)

    # Validation runs inline on the chief, on global batches, reading the variables from the servers;
    # TensorFlow warns at every such call that it is not scheduled, which is meant here.
    logging.getLogger("tensorflow").addFilter(lambda record: "ClusterCoordinator.schedule" not in record.getMessage())
    metrics = EpochMetrics(steps, workload.inputs.dataset(False))
    drive(scheduled_steps, plan.epochs, [metrics, *hooks])
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
