"""The Summary of a run: made once when the run ends (`summarise`), recorded once (`record`).

`summarise` turns what the run measured (its step timer, its mode's figures) and the after-run
figures (TFRecord files, memory, bandwidth, efficiency, the recommendation) into a `Summary`;
`record` writes it to the tracker (metrics in readable units, tags, description, plots,
artifacts) and to the run folder (summary.json in seconds, bytes and fractions; the config).
"""

import json
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from bwopt.measure import HostReferences, PipelineKnobs, TimingFigures, timing_figures
from bwopt.measure.overlap import overlapping_steps_figures
from bwopt.redact import redacted_copy
from bwopt.tracking import readable_metrics

if TYPE_CHECKING:
    from bwopt.run import Run
    from bwopt.workload import Workload


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

    @classmethod
    def from_dict(cls, written: dict) -> "Summary":
        """A Summary from its summary.json (another process's run)."""
        figures = written.get("figures")
        known = set(TimingFigures.__dataclass_fields__)
        return cls(
            run_id=written.get("run_id"),
            status=written["status"],
            mode=written["mode"],
            num_replicas=written.get("num_replicas", 0),
            devices=written.get("devices", []),
            figures=TimingFigures(**{k: v for k, v in figures.items() if k in known}) if figures else None,
            measurements=written.get("measurements", {}),
            final_metrics=written.get("final_metrics", {}),
            recommendation=written.get("recommendation"),
        )


def summarise(run: "Run", status: str) -> Summary:
    """The one place a Summary is assembled: the mode's figures and the after-run ones."""
    workload, config = run.workload, run.config
    batch = config.train.global_batch_size
    figures = None
    # The per-call references the mode measured split the input wait; they become TimingFigures fields.
    references, mode_figures = HostReferences.split_from(run.mode_figures)
    input_plan = workload.input_plan
    if input_plan.steps.timed(run.timer.num_steps):  # none when a failure or a signal came first
        bytes_per_step = batch * input_plan.bytes_per_example
        figures = timing_figures(run.timer, input_plan.steps, batch, bytes_per_step, references)
        figures = overlapping_steps_figures(figures, mode_figures)  # asynchronous steps (parameter_server)
    measurements = {**mode_figures, **after_run_figures(workload, figures)}
    recommendation = None
    if figures is not None and config.mode == "train":
        recommendation = advise(workload, figures, measurements)
    return Summary(
        run_id=run.run_id,
        status=status,
        mode=config.mode,
        num_replicas=workload.strategy.num_replicas_in_sync if workload.strategy is not None else 0,
        devices=workload.replica_devices,
        figures=figures,
        measurements=measurements,
        final_metrics=run.epoch_log.last,
        recommendation=recommendation,
    )


def advise(workload: "Workload", figures: TimingFigures, measurements: Dict[str, float]) -> str:
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
    cores = measurements.get("cores_ceiling_examples_per_s")
    if cores:
        measurements["cores_efficiency"] = figures.throughput_examples_per_s / cores
    config = workload.config
    pipeline = config.pipeline
    knobs = PipelineKnobs(
        prefetch=pipeline.prefetch,
        map_parallelism=pipeline.map_parallelism,
        cache=pipeline.cache,
        transfer_dtype=pipeline.transfer_dtype,
        num_parallel_reads=pipeline.tfrecord.num_parallel_reads if pipeline.tfrecord.enabled else None,
        integer_features=workload.input_plan.integer_features,
    )
    return recommend(
        figures,
        knobs,
        on_cpu=config.device.name == "cpu",
        compute_ceiling_examples_per_s=compute,
        input_ceiling_examples_per_s=input_,
        cores_ceiling_examples_per_s=cores,
        step_cores=measurements.get("step_cores"),
    )


def after_run_figures(workload: "Workload", figures: Optional[TimingFigures]) -> Dict[str, float]:
    """TFRecord files, memory and bandwidth, measured after the mode in the run's own process."""
    from bwopt.measure import host_memcpy_bandwidth_bytes_per_s, peak_device_memory_bytes, peak_host_rss_bytes
    from bwopt.measure.host import available_cores
    from bwopt.signals import STOP

    config = workload.config
    measured: Dict[str, float] = {}
    # Reading every file again takes as long as the data is big: not after a stop signal, which
    # must end the run within seconds (the memcpy probe below is bounded: a fraction of a second).
    if workload.inputs is not None and workload.inputs.materialised and not STOP.requested:
        measured.update(tfrecord_figures(workload))
    if config.data.name == "tfrecord" and config.data.skip_bad_records and not STOP.requested:
        measured["skipped_records"] = skipped_records(workload.source)
    # Before the memcpy test, whose two buffers would raise the peak.
    measured["peak_host_rss_bytes"] = peak_host_rss_bytes()
    if figures is not None and figures.cores_busy is not None:
        measured["cores_available"] = available_cores()
    if config.measure.memcpy_bandwidth:
        measured["host_memcpy_bytes_per_s"] = host_memcpy_bandwidth_bytes_per_s()
        if figures:
            measured["memcpy_share_fraction"] = figures.throughput_bytes_per_s / measured["host_memcpy_bytes_per_s"]
    if workload.replica_devices:
        peaks = peak_device_memory_bytes(workload.replica_devices)
        if peaks:
            measured["peak_device_memory_bytes"] = max(peaks.values())
    return measured


def skipped_records(source) -> int:
    """Records of the user's files that data.skip_bad_records dropped: counted minus parsed."""
    parsed = sum(
        int(source.open_file(path).reduce(0, lambda count, _: count + 1))
        for path in [*source.train_files, *source.validation_files]
    )
    skipped = source.num_train_examples + source.num_validation_examples - parsed
    if skipped:
        print(f"bwopt: warning: skipped {skipped} bad record(s) (data.skip_bad_records=true)", file=sys.stderr)
    return skipped


def tfrecord_figures(workload: "Workload") -> Dict[str, float]:
    """Size, compression ratio and read throughput of the training split's TFRecord shards."""
    from bwopt.data.tfrecord import measure_read_throughput

    files = workload.inputs.tfrecords.get("train")
    if files is None:
        return {}
    settings = workload.config.pipeline.tfrecord
    read = measure_read_throughput(files, settings.num_parallel_reads, settings.buffer_size_bytes)
    return {
        "tfrecord_on_disk_bytes": files.bytes_on_disk,
        "tfrecord_compression_ratio": files.compression_ratio,
        "tfrecord_read_bytes_per_s": read["read_bytes_per_s"],
        "tfrecord_read_examples_per_s": read["read_examples_per_s"],
    }


def record(run: "Run", summary: Summary) -> None:
    """Metrics (in readable units), tags, the description, plots and artifacts to the tracker;
    summary.json (seconds, bytes, fractions) and the resolved config to the run folder."""
    from omegaconf import OmegaConf

    from bwopt.terminal import summary_markdown

    tracker, output_dir = run.tracker, run.output_dir
    tracker.log_metrics(
        readable_metrics({**(summary.figures.metrics() if summary.figures else {}), **summary.measurements})
    )
    if summary.figures and summary.mode == "train":
        tracker.set_tags({"verdict": summary.figures.verdict})  # one verdict per run, as printed
    if summary.recommendation:
        tracker.set_tags({"recommendation": summary.recommendation})
    plots = draw_plots(run, summary)
    tracker.set_description(summary_markdown(summary, [path.name for path in plots]))
    if plots:
        tracker.log_artifacts(plots[0].parent, "plots")
    (output_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    tracker.log_artifacts(output_dir / "summary.json")
    hydra_folder = output_dir / ".hydra"
    if hydra_folder.is_dir():  # Hydra's own copy of the config: log that one, not a second
        with tempfile.TemporaryDirectory() as folder:
            tracker.log_artifacts(redacted_copy(hydra_folder, Path(folder)), ".hydra")
    else:
        OmegaConf.save(OmegaConf.create(run.resolved), output_dir / "config.yaml")
        tracker.log_artifacts(output_dir / "config.yaml")
    if run.config.measure.profile_num_steps and (output_dir / "profile").is_dir():
        tracker.log_artifacts(output_dir / "profile", "profile")


def draw_plots(run: "Run", summary: Summary) -> list:
    if not (run.config.measure.plots and summary.figures):
        return []
    from bwopt.run_plots import write_plots

    try:
        return write_plots(
            run.output_dir / "plots", run.timer, run.workload.input_plan.steps, summary.figures, summary.measurements
        )
    except Exception as error:  # a plot is a picture of the figures: never lose the figures to it
        print(f"bwopt: warning: the plots could not be drawn: {error!r}", file=sys.stderr)
        return []
