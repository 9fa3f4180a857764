"""The three modes a run can be in, each working on a Session that the runner built.

train: the timed training loop, then the ceilings and inference when asked;
input: the distributed training dataset iterated alone (the input ceiling);
inference: forward passes of a freshly built model.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict

from bwopt.inputs import InputPlan, Inputs
from bwopt.measure import StepTimer
from bwopt.schema import AUTOTUNE, Config, ConfigError


@dataclass
class Session:
    """The objects a mode works with, built once by `_set_up`."""

    config: Config
    source: object
    sizes: InputPlan
    strategy: object
    inputs: Inputs
    tracker: object
    timer: StepTimer
    summary: object  # bwopt.runner.Summary
    output_dir: Path
    model: object = None


def distributed(session: Session, training: bool):
    from bwopt.strategies import distribute_input

    return distribute_input(
        session.strategy, session.config.pipeline.distribute, lambda context: session.inputs.dataset(training, context)
    )


def build_model(session: Session):
    from bwopt.models import build_model, build_optimizer

    config, source = session.config, session.source
    with session.strategy.scope():
        model = build_model(config.model, source.feature_shape, source.num_classes)
        optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def run_training(session: Session) -> None:
    """mode=train: the timed training loop, then the ceilings and inference when asked."""
    from bwopt.profiling import StepProfiler
    from bwopt.report import ProgressBar
    from bwopt.train import make_step_functions, train

    config, sizes, summary = session.config, session.sizes, session.summary
    model, optimizer = build_model(session)
    session.model = model
    steps = make_step_functions(
        session.strategy,
        model,
        optimizer,
        config.train.global_batch_size,
        session.source.feature_scale,
        config.device.jit_compile,
        step_compute_s=session.source.step_compute_s,
    )
    tracker = session.tracker

    def on_epoch_end(epoch: int, metrics: Dict[str, float]) -> None:
        tracker.log_metrics(metrics, step=epoch)
        shown = "  ".join(f"{key} {value:.4f}" for key, value in metrics.items())
        print(f"epoch {epoch + 1}/{config.train.epochs}  {shown}", flush=True)

    profiler = StepProfiler(
        str(session.output_dir / "profile"), config.measure.profile_start_step, config.measure.profile_num_steps
    )
    progress = ProgressBar(config.train.epochs, sizes.steps_per_epoch, config.train.global_batch_size)
    progress.enabled = progress.enabled and config.measure.progress
    train_iterator = iter(distributed(session, training=True))
    try:
        summary.final_metrics = train(
            steps,
            train_iterator,
            distributed(session, training=False),
            epochs=config.train.epochs,
            steps_per_epoch=sizes.steps_per_epoch,
            examples_per_step=config.train.global_batch_size,
            num_validation_examples=sizes.num_validation_examples,
            timer=session.timer,
            on_epoch_end=on_epoch_end,
            progress=progress,
            profiler=profiler,
        )
    finally:
        profiler.close()
    if config.measure.profile_num_steps:
        tracker.log_artifacts(session.output_dir / "profile", "profile")
    if config.measure.ceilings:
        _measure_ceilings(session, steps, train_iterator)
    if config.measure.inference_batch_sizes:
        _measure_inference(session, model)


def _measure_ceilings(session: Session, steps, train_iterator) -> None:
    """Both ceilings on the training pipeline as training left it: warm, caches filled."""
    from bwopt.measure import Ceilings, compute_ceiling, input_ceiling
    from bwopt.strategies import place_on_replica_devices

    config = session.config
    batch, num_steps = config.train.global_batch_size, config.measure.ceiling_steps
    input_examples_per_s, input_bytes_per_s = input_ceiling(
        train_iterator, num_steps, batches_to_drain(config), batch, batch * session.sizes.bytes_per_example
    )
    on_devices = place_on_replica_devices(session.strategy, next(train_iterator), session.summary.devices)
    warmup = min(config.train.warmup_steps, num_steps)
    ceilings = Ceilings(
        compute_examples_per_s=compute_ceiling(steps.train_step, on_devices, num_steps, warmup, batch),
        input_examples_per_s=input_examples_per_s,
        input_bytes_per_s=input_bytes_per_s,
    )
    session.summary.measurements.update(ceilings.metrics())


def batches_to_drain(config) -> int:
    """Batches to take, untimed, before timing the input ceiling on the training iterator.

    During training and the last validation pass the pipeline buffered batches (prefetch, the
    per-replica buffer, the tf.data service's own buffers); timing them would count batches made
    earlier. A fixed prefetch depth is known; an autotuned one or the service's is not, so then
    as many batches as will be timed are drained first.
    """
    pipeline = config.pipeline
    if pipeline.prefetch == AUTOTUNE or pipeline.service.mode != "off":
        return config.train.warmup_steps + config.measure.ceiling_steps
    return config.train.warmup_steps + pipeline.prefetch + pipeline.distribute.per_replica_buffer_size


def _measure_inference(session: Session, model) -> None:
    from bwopt.measure.inference import measure_inference

    config, source = session.config, session.source
    with session.strategy.scope():
        results = measure_inference(
            model,
            source.feature_shape,
            config.pipeline.transfer_dtype,
            config.measure.inference_batch_sizes,
            config.measure.inference_batches,
            config.measure.inference_warmup_batches,
            feature_scale=source.feature_scale,
        )
    for figures in results:
        session.summary.measurements.update(figures.metrics())


def run_input_only(session: Session) -> None:
    """mode=input: iterate the distributed training dataset alone, timed like training steps.

    Input wait is the time in `next()`; "compute" is only the wait until every per-replica
    tensor is materialised. Throughput is then the input ceiling of this pipeline.
    """
    import time

    from bwopt.measure.ceilings import wait_for_batch
    from bwopt.train import STOP

    config = session.config
    iterator = iter(distributed(session, training=True))
    for _ in range(config.train.epochs * session.sizes.steps_per_epoch):
        started = time.perf_counter()
        batch = next(iterator)
        fetched = time.perf_counter()
        wait_for_batch(batch)
        session.timer.record(fetched - started, time.perf_counter() - fetched)
        STOP.check()


def run_inference_only(session: Session) -> None:
    """mode=inference: forward passes of a freshly built model at measure.inference_batch_sizes."""
    if not session.config.measure.inference_batch_sizes:
        raise ConfigError("mode=inference needs measure.inference_batch_sizes, e.g. [1,32,256]")
    model, _ = build_model(session)
    _measure_inference(session, model)


MODES = {"train": run_training, "input": run_input_only, "inference": run_inference_only}
