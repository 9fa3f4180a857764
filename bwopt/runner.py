"""Build everything from a validated config, run the timed training, and track it."""

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from bwopt.data.sources import load_source
from bwopt.inputs import InputPlan, Inputs, plan
from bwopt.measure import StepTimer, TimingFigures, timing_figures
from bwopt.schema import Config, ConfigError
from bwopt.tracking import build_tracker, flatten

# Keep TensorFlow's C++ start-up chatter out of the report unless the user asks for it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@dataclass
class Summary:
    """What one run measured; also written as summary.json in the run folder."""

    run_id: Optional[str]
    status: str
    num_replicas: int = 0
    devices: List[str] = field(default_factory=list)
    figures: Optional[TimingFigures] = None
    final_metrics: Dict[str, float] = field(default_factory=dict)

    @property
    def objective(self) -> float:
        """The value a sweeper maximises: training throughput in examples/s."""
        return self.figures.throughput_examples_per_s if self.figures else float("nan")


def run(config: Config, output_dir: Path, resolved: dict) -> Summary:
    """Run one experiment; the MLflow run ends FINISHED, FAILED or KILLED with what was measured."""
    output_dir.mkdir(parents=True, exist_ok=True)
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    sizes = plan(config, source)
    tracker = build_tracker(config.tracking)
    summary = Summary(run_id=tracker.start(flatten(resolved), tags={}), status="FAILED")
    timer = StepTimer()
    try:
        summary.final_metrics = _train(config, source, sizes, tracker, timer, summary)
        summary.status = "FINISHED"
    except KeyboardInterrupt:
        summary.status = "KILLED"
        raise
    finally:
        _finish(config, sizes, tracker, timer, summary, output_dir, resolved)
    return summary


def _train(config: Config, source, sizes: InputPlan, tracker, timer: StepTimer, summary: Summary) -> Dict[str, float]:
    import tensorflow as tf

    from bwopt.devices import configure
    from bwopt.models import build_model, build_optimizer
    from bwopt.strategies import build_strategy, distribute_input, replica_devices
    from bwopt.train import make_step_functions, train

    tf.keras.utils.set_random_seed(config.seed)
    devices = configure(config.device)
    strategy = build_strategy(config.strategy, devices)
    summary.num_replicas = strategy.num_replicas_in_sync
    summary.devices = replica_devices(strategy, devices)
    if config.train.global_batch_size % summary.num_replicas:
        raise ConfigError(
            f"train.global_batch_size={config.train.global_batch_size} is not divisible by the "
            f"{summary.num_replicas} replicas; use a multiple of {summary.num_replicas}"
        )
    tracker.set_tags(
        {
            "tensorflow_version": tf.__version__,
            "devices": ",".join(summary.devices),
            "strategy": config.strategy.name,
            "num_replicas": summary.num_replicas,
        }
    )
    with strategy.scope():
        model = build_model(config.model, source.feature_shape, source.num_classes)
        optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
        optimizer.build(model.trainable_variables)

    inputs = Inputs(config, source, sizes)

    def distributed(training):
        return distribute_input(strategy, config.pipeline.distribute, lambda context: inputs.dataset(training, context))

    def on_epoch_end(epoch: int, metrics: Dict[str, float]) -> None:
        tracker.log_metrics(metrics, step=epoch)
        shown = "  ".join(f"{key} {value:.4f}" for key, value in metrics.items())
        print(f"epoch {epoch + 1}/{config.train.epochs}  {shown}", flush=True)

    steps = make_step_functions(
        strategy, model, optimizer, config.train.global_batch_size, source.feature_scale, config.device.jit_compile,
        step_compute_s=source.step_compute_s,
    )
    return train(
        steps,
        distributed(training=True),
        distributed(training=False),
        epochs=config.train.epochs,
        steps_per_epoch=sizes.steps_per_epoch,
        examples_per_step=config.train.global_batch_size,
        num_validation_examples=sizes.num_validation_examples,
        timer=timer,
        on_epoch_end=on_epoch_end,
    )


def _finish(config: Config, sizes: InputPlan, tracker, timer: StepTimer, summary: Summary, output_dir: Path, resolved) -> None:
    """Keep what was measured, even when the run failed part-way."""
    from omegaconf import OmegaConf

    if timer.num_steps > config.train.warmup_steps:
        summary.figures = timing_figures(
            timer,
            config.train.warmup_steps,
            config.train.global_batch_size,
            config.train.global_batch_size * sizes.bytes_per_example,
        )
        tracker.log_metrics(summary.figures.metrics())
        tracker.set_tags({"input_bound_verdict": summary.figures.input_bound_verdict})
    OmegaConf.save(OmegaConf.create(resolved), output_dir / "config.yaml")
    (output_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    tracker.log_artifacts(output_dir / "config.yaml")
    tracker.log_artifacts(output_dir / "summary.json")
    tracker.log_artifacts(output_dir / ".hydra", ".hydra")
    tracker.end(summary.status)
    print_summary(summary, file=sys.stdout if summary.status == "FINISHED" else sys.stderr)


def print_summary(summary: Summary, file=sys.stdout) -> None:
    lines = [f"bwopt run {summary.status.lower()}  ({summary.num_replicas} replica(s) on {', '.join(summary.devices)})"]
    if summary.figures:
        figures = summary.figures
        lines += [
            f"  throughput        {figures.throughput_examples_per_s:,.1f} examples/s"
            f"  ({figures.throughput_bytes_per_s / 1e6:,.2f} MB/s)",
            f"  step time         p50 {figures.step_time_p50_s * 1e3:.3f} ms  p90 {figures.step_time_p90_s * 1e3:.3f} ms"
            f"  p99 {figures.step_time_p99_s * 1e3:.3f} ms  ({figures.num_timed_steps} timed steps)",
            f"  input wait        {figures.input_wait_fraction:.1%} of step time: {figures.input_bound_verdict}",
        ]
    if "val_accuracy" in summary.final_metrics:
        lines.append(f"  val accuracy      {summary.final_metrics['val_accuracy']:.4f}")
    lines.append(f"  MLflow run        {summary.run_id or '(tracking off)'}")
    print("\n".join(lines), file=file, flush=True)
