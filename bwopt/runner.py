"""Build everything from a validated config, run the timed mode, and track it."""

import json
import os
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from bwopt.data.sources import load_source
from bwopt.inputs import Inputs, plan, timed_steps
from bwopt.measure import StepTimer, TimingFigures, timing_figures
from bwopt.modes import MODES, Session
from bwopt.schema import Config, check_batch_divisible
from bwopt.tracking import build_tracker, flatten

# Keep TensorFlow's C++ start-up chatter out of the report unless the user asks for it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@dataclass
class Summary:
    """What one run measured; also written as summary.json in the run folder.

    Attributes:
        figures: the timed loop's figures (bwopt.measure.TimingFigures).
        measurements: every other run-level figure, by its MLflow metric name.
        final_metrics: the last epoch's loss, accuracy, val_loss, val_accuracy.
    """

    run_id: Optional[str]
    status: str
    mode: str
    num_replicas: int = 0
    devices: List[str] = field(default_factory=list)
    figures: Optional[TimingFigures] = None
    measurements: Dict[str, float] = field(default_factory=dict)
    final_metrics: Dict[str, float] = field(default_factory=dict)
    recommendation: Optional[str] = None

    @property
    def objective(self) -> float:
        """The value a sweeper maximises: throughput in examples/s."""
        return self.figures.throughput_examples_per_s if self.figures else float("nan")


def run(config: Config, output_dir: Path, resolved: dict) -> Summary:
    """Run one experiment; the MLflow run ends FINISHED, FAILED or KILLED with what was measured."""
    from bwopt.measure import reset_peak_host_rss
    from bwopt.train import STOP

    output_dir.mkdir(parents=True, exist_ok=True)
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    sizes = plan(config, source)
    tracker = build_tracker(config.tracking)
    summary = Summary(
        run_id=tracker.start(flatten(resolved), tags={"mode": config.mode}), status="FAILED", mode=config.mode
    )
    reset_peak_host_rss()  # this run's peak, not that of earlier jobs of a multirun
    timer = StepTimer()
    session = None
    try:
        with ExitStack() as resources:
            session = _set_up(config, source, sizes, tracker, timer, summary, output_dir, resources)
            STOP.check()  # a signal during set-up
            MODES[config.mode](session)
            STOP.check()  # a signal during the ceilings or inference
        summary.status = "FINISHED"
    except KeyboardInterrupt:
        summary.status = "KILLED"
        raise
    finally:
        _finish(config, sizes, tracker, timer, summary, output_dir, resolved, session)
    return summary


def _set_up(config, source, sizes, tracker, timer, summary, output_dir, resources: ExitStack) -> Session:
    import tensorflow as tf

    from bwopt.devices import configure
    from bwopt.measure import reset_device_memory_peaks
    from bwopt.strategies import build_strategy, replica_devices

    tf.keras.utils.set_random_seed(config.seed)
    devices = configure(config.device)
    strategy = build_strategy(config.strategy, devices)
    summary.num_replicas = strategy.num_replicas_in_sync
    summary.devices = replica_devices(strategy, devices)
    reset_device_memory_peaks(summary.devices)
    check_batch_divisible(config, summary.num_replicas)  # GPUs are counted only now
    tracker.set_tags(
        {
            "tensorflow_version": tf.__version__,
            "devices": ",".join(summary.devices),
            "strategy": config.strategy.name,
            "num_replicas": summary.num_replicas,
        }
    )
    service = _data_service(config.pipeline.service, resources)
    inputs = Inputs(config, source, sizes, service=service)
    return Session(config, source, sizes, strategy, inputs, tracker, timer, summary, output_dir)


def _data_service(config, resources: ExitStack):
    """The tf.data service transformation for pipeline.service (None when off)."""
    if config.mode == "off":
        return None
    from bwopt.data.service import LocalDataService, distribute

    address = config.address
    if config.mode == "local":
        service = LocalDataService(config.num_workers, allow_external_interfaces=config.allow_external_interfaces)
        address = resources.enter_context(service).address
    return lambda dataset: distribute(dataset, address, config.processing_mode, config.job_name, config.compression)


def _finish(config, sizes, tracker, timer, summary, output_dir, resolved, session) -> None:
    """Keep what was measured, even when the run failed part-way; the MLflow run always ends."""
    try:
        _measure_after(config, sizes, timer, summary, session)
        _record(tracker, summary, output_dir, resolved)
    except KeyboardInterrupt:
        summary.status = "KILLED"
        raise
    except BaseException:
        summary.status = "FAILED"
        raise
    finally:
        tracker.end(summary.status)
    print_summary(summary, file=sys.stdout if summary.status == "FINISHED" else sys.stderr)


def _measure_after(config, sizes, timer, summary, session) -> None:
    """The run-level figures: timing, TFRecord files, memory, bandwidth, efficiency, advice."""
    from bwopt.measure import host_memcpy_bandwidth_bytes_per_s, peak_host_rss_bytes

    measurements = summary.measurements
    batch = config.train.global_batch_size
    kept = [step for step in timed_steps(config, sizes.steps_per_epoch) if step < timer.num_steps]
    if kept:  # none when a failure or a signal came before the first timed step
        excluded = set(range(timer.num_steps)) - set(kept)
        summary.figures = timing_figures(timer, 0, batch, batch * sizes.bytes_per_example, excluded=excluded)
    if session is not None and session.inputs.materialised:
        measurements.update(_tfrecord_figures(session))
    # Before the memcpy test, whose two buffers would raise the peak.
    measurements["peak_host_rss_bytes"] = peak_host_rss_bytes()
    if config.measure.memcpy_bandwidth:
        measurements["host_memcpy_bytes_per_s"] = host_memcpy_bandwidth_bytes_per_s()
        if summary.figures:
            measurements["bytes_per_s_to_memcpy_ratio"] = (
                summary.figures.throughput_bytes_per_s / measurements["host_memcpy_bytes_per_s"]
            )
    _device_memory(summary, measurements)
    _efficiency_and_recommendation(config, sizes, summary)


def _record(tracker, summary: Summary, output_dir: Path, resolved: dict) -> None:
    from omegaconf import OmegaConf

    tracker.log_metrics({**(summary.figures.metrics() if summary.figures else {}), **summary.measurements})
    if summary.figures and summary.mode == "train":
        tracker.set_tags({"input_bound_verdict": summary.figures.input_bound_verdict})
    if summary.recommendation:
        tracker.set_tags({"recommendation": summary.recommendation})
    OmegaConf.save(OmegaConf.create(resolved), output_dir / "config.yaml")
    (output_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    for name in ("config.yaml", "summary.json"):
        tracker.log_artifacts(output_dir / name)
    tracker.log_artifacts(output_dir / ".hydra", ".hydra")


def _tfrecord_figures(session: Session) -> Dict[str, float]:
    """Size, compression ratio and read throughput of the training split's TFRecord shards."""
    from bwopt.data.tfrecord import measure_read_throughput

    files = session.inputs.tfrecords.get("train")
    if files is None:
        return {}
    settings = session.config.pipeline.tfrecord
    read = measure_read_throughput(files, settings.num_parallel_reads, settings.buffer_size_bytes)
    return {
        "tfrecord_bytes_on_disk": files.bytes_on_disk,
        "tfrecord_compression_ratio": files.compression_ratio,
        "tfrecord_read_bytes_per_s": read["read_bytes_per_s"],
        "tfrecord_read_examples_per_s": read["read_examples_per_s"],
    }


def _device_memory(summary: Summary, measurements: Dict[str, float]) -> None:
    if "tensorflow" not in sys.modules or not summary.devices:
        return
    from bwopt.measure import peak_device_memory_bytes

    peaks = peak_device_memory_bytes(summary.devices)
    if peaks:
        measurements["peak_device_memory_bytes"] = max(peaks.values())


def _efficiency_and_recommendation(config, sizes, summary: Summary) -> None:
    from bwopt.measure import efficiency, recommend

    if not summary.figures or config.mode != "train":
        return
    measurements = summary.measurements
    compute = measurements.get("compute_ceiling_examples_per_s")
    input_ = measurements.get("input_ceiling_examples_per_s")
    ratio = efficiency(summary.figures.throughput_examples_per_s, compute, input_)
    if ratio is not None:
        measurements["efficiency"] = ratio
    pipeline = config.pipeline
    summary.recommendation = recommend(
        summary.figures,
        prefetch=pipeline.prefetch,
        map_parallelism=pipeline.map_parallelism,
        cache=pipeline.cache,
        transfer_dtype=pipeline.transfer_dtype,
        num_parallel_reads=pipeline.tfrecord.num_parallel_reads if pipeline.tfrecord.enabled else None,
        integer_features=sizes.integer_features,
        on_cpu=config.device.name == "cpu",
        compute_ceiling_examples_per_s=compute,
        input_ceiling_examples_per_s=input_,
    )


def print_summary(summary: Summary, file=sys.stdout) -> None:
    from bwopt.report import figures_table

    head = f"bwopt {summary.mode} run {summary.status.lower()}"
    if summary.devices:
        head += f"  ({summary.num_replicas} replica(s) on {', '.join(summary.devices)})"
    figures = {**(asdict(summary.figures) if summary.figures else {}), **summary.measurements}
    figures.update({key: value for key, value in summary.final_metrics.items() if key == "val_accuracy"})
    if summary.recommendation:
        figures["recommendation"] = summary.recommendation
    figures["mlflow_run_id"] = summary.run_id or "(tracking off)"
    print(head + "\n" + figures_table(figures), file=file, flush=True)
