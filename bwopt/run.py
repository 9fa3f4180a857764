"""The Run: one owner for the life of one experiment.

    with Run(config, output_dir, resolved) as run:   # load the source, plan inputs, start tracking
        run.set_up()                                  # devices, strategy, inputs
        figures = MODES[config.mode](run)             # the work; it returns what it measured
    run.summary                                       # status, figures, records: made on leaving

Leaving the block picks the status from the exception (none: FINISHED, KeyboardInterrupt:
KILLED, anything else: FAILED), takes the after-run figures, builds the `Summary` in one place,
records it (MLflow, summary.json, config.yaml) and ends the MLflow run, whatever happened.
"""

import json
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.data.sources import load_source
from bwopt.inputs import Inputs, plan
from bwopt.loop import Hook
from bwopt.measure import StepTimer, TimingFigures, timing_figures
from bwopt.schema import Config, check_batch_divisible
from bwopt.signals import STOP, StopCheck
from bwopt.tracking import build_tracker, flatten


@dataclass
class Summary:
    """What one run measured; also written as summary.json in the run folder.

    Attributes:
        figures: the timed loop's figures (bwopt.measure.TimingFigures); None when no timed step ran.
        measurements: every other run-level figure, by its MLflow metric name.
        final_metrics: the last finished epoch's loss, accuracy, val_loss, val_accuracy.
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


def run(config: Config, output_dir: Path, resolved: dict, overrides: Sequence[str] = ()) -> Summary:
    """Run one experiment; the MLflow run ends FINISHED, FAILED or KILLED with what was measured.

    `overrides` are the command line's `key=value`s: they name the MLflow run.
    """
    from bwopt.modes import MODES

    with Run(config, output_dir, resolved, overrides) as current:
        current.set_up()
        STOP.check()  # a signal during set-up
        current.mode_figures = MODES[config.mode](current)
        STOP.check()  # a signal during the ceilings or inference
    return current.summary


class EpochLog(Hook):
    """Each epoch's metrics: printed, logged to the tracker (step = epoch), the last one kept."""

    def __init__(self, tracker, epochs: int) -> None:
        self.tracker = tracker
        self.epochs = epochs
        self.last: Dict[str, float] = {}

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        if not logs:  # mode=input has no epoch metrics
            return
        self.last = dict(logs)
        self.tracker.log_metrics(logs, step=epoch)
        shown = "  ".join(f"{key} {value:.4f}" for key, value in logs.items())
        print(f"epoch {epoch + 1}/{self.epochs}  {shown}", flush=True)


class Run:
    """What one experiment needs, kept on `self`, and its life: enter, `set_up`, a mode, exit."""

    def __init__(self, config: Config, output_dir: Path, resolved: dict, overrides: Sequence[str] = ()) -> None:
        self.config = config
        self.output_dir = output_dir
        self.resolved = resolved
        self.overrides = list(overrides)
        self.timer = StepTimer()
        self.resources = ExitStack()  # servers the run started (the local tf.data service)
        self.mode_figures: Dict[str, float] = {}
        self.replica_devices: List[str] = []
        self.strategy = self.inputs = None
        self.summary: Optional[Summary] = None

    def __enter__(self) -> "Run":
        from bwopt.measure import reset_peak_host_rss

        config = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.source = load_source(config.data, config.seed, config.split.validation_fraction)
        self.input_plan = plan(config, self.source)
        self.tracker = build_tracker(config.tracking)
        self.run_id = self.tracker.start(flatten(self.resolved), {"mode": config.mode}, self.overrides)
        self.epoch_log = EpochLog(self.tracker, config.train.epochs)
        reset_peak_host_rss()  # this run's peak, not that of earlier jobs of a multirun
        return self

    def set_up(self) -> None:
        """Devices, strategy and inputs, in that order (TensorFlow fixes its devices first)."""
        import tensorflow as tf

        from bwopt.devices import configure
        from bwopt.measure import reset_device_memory_peaks
        from bwopt.strategies import build_strategy, replica_devices

        config = self.config
        tf.keras.utils.set_random_seed(config.seed)
        devices = configure(config.device)
        self.strategy = build_strategy(config.strategy, devices)
        self.replica_devices = replica_devices(self.strategy, devices)
        reset_device_memory_peaks(self.replica_devices)
        check_batch_divisible(config, self.strategy.num_replicas_in_sync)  # GPUs are counted only now
        self.tracker.set_tags(
            {
                "tensorflow_version": tf.__version__,
                "devices": ",".join(self.replica_devices),
                "strategy": config.strategy.name,
                "num_replicas": self.strategy.num_replicas_in_sync,
            }
        )
        self.inputs = Inputs(config, self.source, self.input_plan, service=self._data_service())

    def _data_service(self):
        """The tf.data service transformation for pipeline.service (None when off)."""
        settings = self.config.pipeline.service
        if settings.mode == "off":
            return None
        from bwopt.data.service import LocalDataService, distribute

        address = settings.address
        if settings.mode == "local":
            service = LocalDataService(
                settings.num_workers, allow_external_interfaces=settings.allow_external_interfaces
            )
            address = self.resources.enter_context(service).address
        return lambda dataset: distribute(
            dataset, address, settings.processing_mode, settings.job_name, settings.compression
        )

    # --- what the modes use ---------------------------------------------------------------

    def build_model(self):
        """(model, optimizer), built in the strategy's scope."""
        from bwopt.models import build_model, build_optimizer

        config = self.config
        with self.strategy.scope():
            model = build_model(config.model, self.source.feature_shape, self.source.num_classes)
            optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
            optimizer.build(model.trainable_variables)
        return model, optimizer

    def distributed_dataset(self, training: bool):
        """The training or validation dataset, distributed as pipeline.distribute says."""
        from bwopt.strategies import distribute_input

        return distribute_input(
            self.strategy,
            self.config.pipeline.distribute,
            lambda context: self.inputs.dataset(training, context),
        )

    def loop_hooks(self) -> List[Hook]:
        """The run's hooks on the timed loop: step timer, epoch log, profiler, progress, stop check."""
        from bwopt.profiling import StepProfiler
        from bwopt.report import ProgressBar

        config, steps = self.config, self.input_plan.steps
        hooks: List[Hook] = [self.timer, self.epoch_log]
        if config.mode == "train" and config.measure.profile_num_steps:
            hooks.append(StepProfiler(str(self.output_dir / "profile"), steps.profiled))
        if config.measure.progress:
            hooks.append(ProgressBar(steps.epochs, steps.steps_per_epoch, config.train.global_batch_size))
        return [*hooks, StopCheck()]

    # --- the end ----------------------------------------------------------------------------

    def __exit__(self, exc_type, exc, traceback) -> bool:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        try:
            self.summary = self.summarise(status)
            self.record(self.summary)
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.resources.close()
            self.tracker.end(status)
            if self.summary is not None:
                self.summary.status = status
                from bwopt.report import print_summary

                print_summary(self.summary, file=sys.stdout if status == "FINISHED" else sys.stderr)
        return False

    def summarise(self, status: str) -> Summary:
        """The one place a Summary is assembled: the modes' figures and the after-run ones."""
        config, input_plan = self.config, self.input_plan
        batch = config.train.global_batch_size
        figures = None
        if input_plan.steps.timed(self.timer.num_steps):  # none when a failure or a signal came first
            figures = timing_figures(self.timer, input_plan.steps, batch, batch * input_plan.bytes_per_example)
        measurements = {**self.mode_figures, **self.after_run_figures(figures)}
        recommendation = None
        if figures is not None and config.mode == "train":
            recommendation = self._advise(figures, measurements)
        return Summary(
            run_id=self.run_id,
            status=status,
            mode=config.mode,
            num_replicas=self.strategy.num_replicas_in_sync if self.strategy is not None else 0,
            devices=self.replica_devices,
            figures=figures,
            measurements=measurements,
            final_metrics=self.epoch_log.last,
            recommendation=recommendation,
        )

    def _advise(self, figures: TimingFigures, measurements: Dict[str, float]) -> str:
        """Efficiency against the ceilings (added to `measurements`) and the recommendation."""
        from bwopt.measure import efficiency, recommend

        compute = measurements.get("compute_ceiling_examples_per_s")
        input_ = measurements.get("input_ceiling_examples_per_s")
        ratio = efficiency(figures.throughput_examples_per_s, compute, input_)
        if ratio is not None:
            measurements["efficiency"] = ratio
        pipeline = self.config.pipeline
        return recommend(
            figures,
            prefetch=pipeline.prefetch,
            map_parallelism=pipeline.map_parallelism,
            cache=pipeline.cache,
            transfer_dtype=pipeline.transfer_dtype,
            num_parallel_reads=pipeline.tfrecord.num_parallel_reads if pipeline.tfrecord.enabled else None,
            integer_features=self.input_plan.integer_features,
            on_cpu=self.config.device.name == "cpu",
            compute_ceiling_examples_per_s=compute,
            input_ceiling_examples_per_s=input_,
        )

    def after_run_figures(self, figures: Optional[TimingFigures]) -> Dict[str, float]:
        """TFRecord files, memory and bandwidth, measured after the mode in the run's own process."""
        from bwopt.measure import host_memcpy_bandwidth_bytes_per_s, peak_device_memory_bytes, peak_host_rss_bytes

        measured: Dict[str, float] = {}
        if self.inputs is not None and self.inputs.materialised:
            measured.update(self._tfrecord_figures())
        # Before the memcpy test, whose two buffers would raise the peak.
        measured["peak_host_rss_bytes"] = peak_host_rss_bytes()
        if self.config.measure.memcpy_bandwidth:
            measured["host_memcpy_bytes_per_s"] = host_memcpy_bandwidth_bytes_per_s()
            if figures:
                measured["bytes_per_s_to_memcpy_ratio"] = (
                    figures.throughput_bytes_per_s / measured["host_memcpy_bytes_per_s"]
                )
        if self.replica_devices:
            peaks = peak_device_memory_bytes(self.replica_devices)
            if peaks:
                measured["peak_device_memory_bytes"] = max(peaks.values())
        return measured

    def _tfrecord_figures(self) -> Dict[str, float]:
        """Size, compression ratio and read throughput of the training split's TFRecord shards."""
        from bwopt.data.tfrecord import measure_read_throughput

        files = self.inputs.tfrecords.get("train")
        if files is None:
            return {}
        settings = self.config.pipeline.tfrecord
        read = measure_read_throughput(files, settings.num_parallel_reads, settings.buffer_size_bytes)
        return {
            "tfrecord_bytes_on_disk": files.bytes_on_disk,
            "tfrecord_compression_ratio": files.compression_ratio,
            "tfrecord_read_bytes_per_s": read["read_bytes_per_s"],
            "tfrecord_read_examples_per_s": read["read_examples_per_s"],
        }

    def record(self, summary: Summary) -> None:
        """Metrics, tags and artifacts to the tracker; config.yaml and summary.json to the run folder."""
        from omegaconf import OmegaConf

        tracker = self.tracker
        tracker.log_metrics({**(summary.figures.metrics() if summary.figures else {}), **summary.measurements})
        if summary.figures and summary.mode == "train":
            tracker.set_tags({"input_bound_verdict": summary.figures.input_bound_verdict})
        if summary.recommendation:
            tracker.set_tags({"recommendation": summary.recommendation})
        OmegaConf.save(OmegaConf.create(self.resolved), self.output_dir / "config.yaml")
        (self.output_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
        for name in ("config.yaml", "summary.json"):
            tracker.log_artifacts(self.output_dir / name)
        tracker.log_artifacts(self.output_dir / ".hydra", ".hydra")
        if self.config.measure.profile_num_steps and (self.output_dir / "profile").is_dir():
            tracker.log_artifacts(self.output_dir / "profile", "profile")
