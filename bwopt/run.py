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
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.coordinated import overlapping_steps_figures
from bwopt.data.sources import load_source
from bwopt.inputs import Inputs, check_fits_in_memory, plan
from bwopt.loop import Hook
from bwopt.measure import HostReferences, StepPlan, StepTimer, TimingFigures, timing_figures
from bwopt.redact import redact, redact_text, redacted_copy
from bwopt.schema import Config, check_batch_divisible
from bwopt.signals import STOP, StopCheck
from bwopt.tracking import build_tracker, flatten, readable_metrics


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
        current.mode_figures = current.run_mode(MODES[config.mode])
        STOP.check()  # a signal during the ceilings or inference
    return current.summary


# Figures of each epoch's own steps, logged as `epoch/...` series beside loss and accuracy.
EPOCH_SERIES = ("throughput_examples_per_s", "input_wait_fraction", "step_time_p50_s")


def tensorflow_reason(error: Exception) -> str:
    """The one line of a TensorFlow error that says what is wrong: a bwopt check's own message
    ("bad record: ..."), else TensorFlow's first line without its function-node prefix."""
    import re

    text = str(getattr(error, "message", error))
    own = re.search(r"bad record: (.*?)\] \[", text) or re.search(r"bad record: (.*?)\]", text)
    if own:
        return own.group(1).replace("\\'", "'")
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first)


class EpochLog(Hook):
    """Each epoch's metrics, printed and logged to the tracker at step = the epoch's number as printed
    (1, 2, ...), with the epoch's own timing (throughput, input-wait share, step-time p50) beside
    them so that they draw as series; the last epoch's metrics are kept for the summary."""

    def __init__(self, run: "Run") -> None:
        self.tracker = run.tracker
        self.timer = run.timer
        self.plan = run.input_plan.steps
        self.examples_per_step = run.config.train.global_batch_size
        self.bytes_per_step = self.examples_per_step * run.input_plan.bytes_per_example
        self.last: Dict[str, float] = {}
        self.epochs_done = 0

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        if not logs:  # mode=input has no epoch metrics
            return
        self.last = dict(logs)
        self.epochs_done = epoch + 1
        self.tracker.log_metrics({**logs, **self.epoch_timing(epoch)}, step=epoch + 1)
        shown = "  ".join(f"{key} {value:.4f}" for key, value in logs.items())
        print(f"epoch {epoch + 1}/{self.plan.epochs}  {shown}", flush=True)

    def epoch_timing(self, epoch: int) -> Dict[str, float]:
        """`epoch/...` metrics of this epoch's timed steps (none when all were warm-up)."""
        first, end = epoch * self.plan.steps_per_epoch, (epoch + 1) * self.plan.steps_per_epoch
        kept = [step for step in self.plan.timed(self.timer.num_steps) if first <= step < end]
        if not kept:
            return {}
        epoch_timer = StepTimer([self.timer.input_wait_s[i] for i in kept], [self.timer.compute_s[i] for i in kept])
        plan = StepPlan(1, len(kept), 0, steps_per_execution=self.plan.steps_per_execution)
        figures = timing_figures(epoch_timer, plan, self.examples_per_step, self.bytes_per_step)
        metrics = readable_metrics({key: getattr(figures, key) for key in EPOCH_SERIES})
        return {f"epoch/{key}": value for key, value in metrics.items()}


class Run:
    """What one experiment needs, kept on `self`, and its life: enter, `set_up`, a mode, exit."""

    def __init__(self, config: Config, output_dir: Path, resolved: dict, overrides: Sequence[str] = ()) -> None:
        self.config = config
        self.output_dir = output_dir
        self.resolved = redact(resolved)  # what bwopt logs and writes carries no secret
        self.overrides = [redact_text(override) for override in overrides]
        self.timer = StepTimer()
        self.resources = ExitStack()  # servers the run started (the local tf.data service)
        self.mode_figures: Dict[str, float] = {}
        self.replica_devices: List[str] = []
        self.stage_devices: List[str] = []
        self.model = self.optimizer = None
        self.resume_state = None  # bwopt.checkpoint.ResumeState of the stopped run this one continues
        self.strategy = self.inputs = self.cluster = None
        self.summary: Optional[Summary] = None

    def __enter__(self) -> "Run":
        """Load and plan the data, set up devices and strategy, then start tracking.

        Everything that can reject the config (sizes, a device that is not there, a batch that the
        replicas cannot share) comes before the MLflow run exists, so a mistake leaves no FAILED run.
        """
        from bwopt.measure import reset_peak_host_rss

        config = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        check_fits_in_memory(config)
        self.source = load_source(config.data, config.seed, config.split.validation_fraction)
        self.input_plan = plan(config, self.source)
        service = config.pipeline.service
        if service.mode != "off":  # before the MLflow run: neither is a measurement
            from bwopt.data.service import check_loopback_only, check_reachable

            if service.mode == "remote":  # TensorFlow would wait for it forever
                check_reachable(service.address)
            else:
                check_loopback_only(service.allow_external_interfaces)
        self._build_strategy()
        self._find_stopped_run()
        self.tracker = build_tracker(config.tracking)
        resumed = self.resume_state.run_id if self.resume_state else None
        self.run_id = self.tracker.start(flatten(self.resolved), {"mode": config.mode}, self.overrides, resumed)
        self.epoch_log = EpochLog(self)
        if self.resume_state is not None:  # the finished epochs count as if they ran now
            self.timer.input_wait_s = list(self.resume_state.input_wait_s)
            self.timer.compute_s = list(self.resume_state.compute_s)
            self.epoch_log.last = dict(self.resume_state.epoch_metrics)
            self.epoch_log.epochs_done = self.resume_state.epochs_done
        reset_peak_host_rss()  # this run's peak, not that of earlier jobs of a multirun
        return self

    def _find_stopped_run(self) -> None:
        """Resume the stopped run in this run folder, or with train.resume the latest one of this command."""
        from bwopt import checkpoint
        from bwopt.schema import ConfigError

        if self.config.mode != "train":
            return
        if self.config.train.resume and checkpoint.load_state(self.output_dir) is None:
            runs_root = self.output_dir.parent.parent  # outputs/runs/<date>/<time>
            found = checkpoint.find_resumable(runs_root, self.overrides)
            if found is None:
                raise ConfigError(
                    f"train.resume=true: no run of this command stopped with a checkpoint under {runs_root}; "
                    "run it without train.resume"
                )
            self.output_dir = found
        self.resume_state = checkpoint.load_state(self.output_dir)
        if self.resume_state is not None:
            done = self.resume_state.epochs_done
            self.input_plan.steps = replace(self.input_plan.steps, first_epoch=done)
            print(f"bwopt: resuming the run in {self.output_dir} after {done} finished epoch(s)", flush=True)

    def restore_checkpoint(self) -> None:
        """The stopped run's model and optimizer variables, into the ones just built (nothing to do otherwise)."""
        if self.resume_state is not None:
            from bwopt import checkpoint

            checkpoint.restore(self.output_dir, self.model, self.optimizer)

    def _build_strategy(self) -> None:
        """Devices, then the strategy (TensorFlow fixes its devices first)."""
        from bwopt.cluster import resolve
        from bwopt.measure import reset_device_memory_peaks
        from bwopt.strategies import replica_devices, set_up_strategy, stage_devices

        # None without a cluster; a multi-process strategy joins its cluster here (bwopt.cluster).
        self.cluster = resolve(self.config.cluster, self.config.strategy)
        devices, self.strategy = set_up_strategy(self.config.strategy, self.config.device, self.cluster)
        # model_parallel: one replica, its stages on these devices (what the summary lists then).
        self.stage_devices = stage_devices(self.config.strategy, devices)
        self.replica_devices = self.stage_devices or replica_devices(self.strategy, devices)
        reset_device_memory_peaks(self.replica_devices)
        check_batch_divisible(self.config, self.strategy.num_replicas_in_sync)  # GPUs are counted only now

    def set_up(self) -> None:
        """The run's seed and the inputs; the devices and strategy are recorded as tags."""
        import tensorflow as tf

        from bwopt.cluster import describe

        config = self.config
        tf.keras.utils.set_random_seed(config.seed)
        self.tracker.set_tags(
            {
                "tensorflow_version": tf.__version__,
                "devices": ",".join(self.replica_devices),
                "strategy": config.strategy.name,
                "num_replicas": self.strategy.num_replicas_in_sync,
                **({"cluster_tasks": describe(self.cluster)} if self.cluster else {}),
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

    def run_mode(self, mode) -> Dict[str, float]:
        """The mode's figures; a TensorFlow error from the user's data files becomes a DataError naming the file."""
        try:
            return mode(self)
        except Exception as error:
            data_error = self.diagnose(error)
            if data_error is None:
                raise
            raise data_error from error

    def diagnose(self, error: Exception):
        """A DataError naming the first file (and record) of data=tfrecord that fails to read, or None.

        TensorFlow's reader says "corrupted record at 19964" without the file; reading the files
        one by one again, only after a failure, finds it.
        """
        if self.config.data.name != "tfrecord" or type(error).__module__.split(".")[0] != "tensorflow":
            return None
        from bwopt.data.records import DataError

        for path in [*self.source.train_files, *self.source.validation_files]:
            index = 0
            try:
                for index, _ in enumerate(self.source.open_file(path), start=1):
                    pass
            except Exception as file_error:  # the same TensorFlow error, now from one known file
                return DataError(
                    f"{path}: record {index}: {tensorflow_reason(file_error)}; fix or remove the file, check the "
                    "data.* keys named, "
                    "or set data.skip_bad_records=true to skip bad records"
                )
        return None

    def build_model(self):
        """(model, optimizer), built in the strategy's scope."""
        from bwopt.models import build_model, build_optimizer

        config = self.config
        with self.strategy.scope():
            model = build_model(config.model, self.source.feature_shape, self.source.num_classes, self.stage_devices)
            optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
            optimizer.build(model.trainable_variables)
        self.model, self.optimizer = model, optimizer
        return model, optimizer

    def step_functions(self, steps_per_execution: int = 1):
        """The compiled distributed train and evaluation steps of the model `build_model` made."""
        from bwopt.train import make_step_functions

        config = self.config
        return make_step_functions(
            self.strategy,
            self.model,
            self.optimizer,
            config.train.global_batch_size,
            self.source.feature_scale,
            config.device.jit_compile,
            step_compute_s=self.source.step_compute_s,
            steps_per_execution=steps_per_execution,
        )

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
            examples_per_loop_step = config.train.global_batch_size * steps.steps_per_execution
            hooks.append(ProgressBar(steps.epochs, steps.steps_per_epoch, examples_per_loop_step))
        if config.mode == "train" and config.train.terminate_on_nan:
            from bwopt.train import TerminateOnNaN

            hooks.append(TerminateOnNaN())
        return [*hooks, StopCheck()]

    # --- the end ----------------------------------------------------------------------------

    def __exit__(self, exc_type, exc, traceback) -> bool:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        STOP.finishing = True  # a second signal now must not cost the records
        if exc_type is not None:  # why the run did not finish, on the run's page
            reason = (
                f"stopped by {STOP.requested}"
                if status == "KILLED" and STOP.requested
                else f"{exc_type.__name__}: {exc}"
            )
            self.tracker.set_tags({"bwopt.end_reason": redact_text(reason)[:5000]})
        try:
            self._keep_or_drop_checkpoint(status)
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
            STOP.finishing = False
        return False

    def _keep_or_drop_checkpoint(self, status: str) -> None:
        """Stopped by a signal while training: write the state to resume from. Finished: none is left."""
        from bwopt import checkpoint

        if status == "FINISHED":
            checkpoint.remove(self.output_dir)
            return
        if status != "KILLED" or self.model is None or not self.config.train.checkpoint_on_stop:
            return
        done = self.epoch_log.epochs_done
        steps = done * self.input_plan.steps.steps_per_epoch
        state = checkpoint.ResumeState(
            run_id=self.run_id,
            epochs_done=done,
            input_wait_s=self.timer.input_wait_s[:steps],
            compute_s=self.timer.compute_s[:steps],
            epoch_metrics=self.epoch_log.last,
            overrides=self.overrides,
        )
        checkpoint.save(self.output_dir, state, self.model, self.optimizer)
        print(
            f"bwopt: checkpoint written to {self.output_dir / checkpoint.FOLDER} after {done} epoch(s)", file=sys.stderr
        )

    def summarise(self, status: str) -> Summary:
        """The one place a Summary is assembled: the modes' figures and the after-run ones."""
        config, input_plan = self.config, self.input_plan
        batch = config.train.global_batch_size
        figures = None
        # The per-call references the mode measured split the input wait; they become TimingFigures fields.
        references, mode_figures = HostReferences.split_from(self.mode_figures)
        if input_plan.steps.timed(self.timer.num_steps):  # none when a failure or a signal came first
            bytes_per_step = batch * input_plan.bytes_per_example
            figures = timing_figures(self.timer, input_plan.steps, batch, bytes_per_step, references)
            figures = overlapping_steps_figures(figures, mode_figures)  # asynchronous steps (parameter_server)
        measurements = {**mode_figures, **self.after_run_figures(figures)}
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
        from bwopt.measure import efficiency, efficiency_spread, recommend

        compute = measurements.get("compute_ceiling_examples_per_s")
        input_ = measurements.get("input_ceiling_examples_per_s")
        ratio = efficiency(figures.throughput_examples_per_s, compute, input_)
        if ratio is not None:
            measurements["efficiency"] = ratio
            spread = efficiency_spread(ratio, measurements)
            if spread is not None:
                measurements["efficiency_spread"] = spread
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
        if self.config.data.name == "tfrecord" and self.config.data.skip_bad_records:
            measured["skipped_records"] = self._skipped_records()
        # Before the memcpy test, whose two buffers would raise the peak.
        measured["peak_host_rss_bytes"] = peak_host_rss_bytes()
        if self.config.measure.memcpy_bandwidth:
            measured["host_memcpy_bytes_per_s"] = host_memcpy_bandwidth_bytes_per_s()
            if figures:
                measured["memcpy_share_fraction"] = figures.throughput_bytes_per_s / measured["host_memcpy_bytes_per_s"]
        if self.replica_devices:
            peaks = peak_device_memory_bytes(self.replica_devices)
            if peaks:
                measured["peak_device_memory_bytes"] = max(peaks.values())
        return measured

    def _skipped_records(self) -> int:
        """Records of the user's files that data.skip_bad_records dropped: counted minus parsed."""
        source = self.source
        parsed = sum(
            int(source.open_file(path).reduce(0, lambda count, _: count + 1))
            for path in [*source.train_files, *source.validation_files]
        )
        skipped = source.num_train_examples + source.num_validation_examples - parsed
        if skipped:
            print(f"bwopt: warning: skipped {skipped} bad record(s) (data.skip_bad_records=true)", file=sys.stderr)
        return skipped

    def _tfrecord_figures(self) -> Dict[str, float]:
        """Size, compression ratio and read throughput of the training split's TFRecord shards."""
        from bwopt.data.tfrecord import measure_read_throughput

        files = self.inputs.tfrecords.get("train")
        if files is None:
            return {}
        settings = self.config.pipeline.tfrecord
        read = measure_read_throughput(files, settings.num_parallel_reads, settings.buffer_size_bytes)
        return {
            "tfrecord_on_disk_bytes": files.bytes_on_disk,
            "tfrecord_compression_ratio": files.compression_ratio,
            "tfrecord_read_bytes_per_s": read["read_bytes_per_s"],
            "tfrecord_read_examples_per_s": read["read_examples_per_s"],
        }

    def record(self, summary: Summary) -> None:
        """Metrics (in readable units), tags, the description, plots and artifacts to the tracker;
        summary.json (seconds, bytes, fractions) and the resolved config to the run folder."""
        from omegaconf import OmegaConf

        from bwopt.report import summary_markdown

        tracker = self.tracker
        tracker.log_metrics(
            readable_metrics({**(summary.figures.metrics() if summary.figures else {}), **summary.measurements})
        )
        if summary.figures and summary.mode == "train":
            tracker.set_tags(
                {"verdict": summary.figures.verdict, "input_bound_verdict": summary.figures.input_bound_verdict}
            )
        if summary.recommendation:
            tracker.set_tags({"recommendation": summary.recommendation})
        plots = self._plots(summary)
        tracker.set_description(summary_markdown(summary, [path.name for path in plots]))
        if plots:
            tracker.log_artifacts(plots[0].parent, "plots")
        (self.output_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
        tracker.log_artifacts(self.output_dir / "summary.json")
        hydra_folder = self.output_dir / ".hydra"
        if hydra_folder.is_dir():  # Hydra's own copy of the config: log that one, not a second
            with tempfile.TemporaryDirectory() as folder:
                tracker.log_artifacts(redacted_copy(hydra_folder, Path(folder)), ".hydra")
        else:
            OmegaConf.save(OmegaConf.create(self.resolved), self.output_dir / "config.yaml")
            tracker.log_artifacts(self.output_dir / "config.yaml")
        if self.config.measure.profile_num_steps and (self.output_dir / "profile").is_dir():
            tracker.log_artifacts(self.output_dir / "profile", "profile")

    def _plots(self, summary: Summary) -> list:
        if not (self.config.measure.plots and summary.figures):
            return []
        from bwopt.plots import write_plots

        try:
            return write_plots(
                self.output_dir / "plots", self.timer, self.input_plan.steps, summary.figures, summary.measurements
            )
        except Exception as error:  # a plot is a picture of the figures: never lose the figures to it
            print(f"bwopt: warning: the plots could not be drawn: {error!r}", file=sys.stderr)
            return []
