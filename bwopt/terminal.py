"""What a person reads at the end of a run: the table of figures, and the same table in Markdown
for the MLflow run's description (the live progress line is bwopt.progress)."""

import sys
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

from bwopt.measure.advice import cores_bound


def summary_table(rows: List[Tuple[str, str]], indent: str = "  ", line_width: Optional[int] = None) -> str:
    """Two aligned columns: labels padded to the longest one, then two spaces, then values.

    A value longer than the line (`line_width`, default the terminal's width, 100 in a pipe)
    wraps at word boundaries, its continuation lines aligned under the value column.
    """
    import shutil
    import textwrap

    width = max((len(label) for label, _ in rows), default=0)
    line_width = line_width or shutil.get_terminal_size((100, 24)).columns
    value_width = max(line_width - len(indent) - width - 2, 40)
    continuation = "\n" + " " * (len(indent) + width + 2)
    return "\n".join(
        f"{indent}{label.ljust(width)}  {continuation.join(textwrap.wrap(value, value_width)) or value}"
        for label, value in rows
    )


def figure_rows(figures: Dict[str, object]) -> List[Tuple[str, str]]:
    """Rows for the figures present (missing or None values are skipped).

    Keys are the MLflow metric names (`throughput_examples_per_s`, `step_time_p50_s`, ...,
    `input_wait_fraction`, `input_bound_verdict`, `efficiency`,
    `compute_ceiling_examples_per_s`, `input_ceiling_examples_per_s`,
    `input_ceiling_bytes_per_s`, `host_memcpy_bytes_per_s`, `peak_host_rss_bytes`,
    `inference_bs<N>_examples_per_s` and `_latency_p50_s`..., `val_accuracy`) plus
    `peak_device_memory_bytes` (bytes, or device name -> bytes), `recommendation` and
    `mlflow_run_id`. Other keys are ignored.
    """
    present = {key: value for key, value in figures.items() if value is not None}
    rows = [(label, format_row(present)) for label, format_row in MEASURED_ROWS]
    rows += inference_rows(present)
    rows += [(label, format_row(present)) for label, format_row in CLOSING_ROWS]
    return [(label, value) for label, value in rows if value]


def figures_table(figures: Dict[str, object]) -> str:
    """The figures present, formatted as a `summary_table`."""
    return summary_table(figure_rows(figures))


def _interval(f, key: str, spec: str) -> str:
    """ " (95 % CI low–high)" of the interval `f[key]` formatted with `spec`; "" when there is none."""
    bounds = f.get(key)
    return f" (95 % CI {bounds[0]:{spec}}–{bounds[1]:{spec}})" if bounds else ""


def _throughput(f) -> str:
    if "throughput_examples_per_s" not in f:
        return ""
    text = f"{f['throughput_examples_per_s']:,.1f} examples/s" + _interval(f, "throughput_examples_per_s_ci95", ",.0f")
    if "throughput_bytes_per_s" in f:
        text += f"  ({f['throughput_bytes_per_s'] / 1e6:,.2f} MB/s)"
    return text


def _step_time(f) -> str:
    parts = [
        f"{name} {f[key] * 1e3:.3f} ms"
        for name, key in (
            ("p50", "step_time_p50_s"),
            ("p90", "step_time_p90_s"),
            ("p99", "step_time_p99_s"),
            ("jitter", "step_time_jitter_s"),
        )
        if key in f
    ]
    if parts and "num_timed_steps" in f:
        window = f" in {f['timed_wall_s']:.2f} s" if "timed_wall_s" in f else ""
        parts.append(f"({f['num_timed_steps']:,} timed steps{window})")
    return "  ".join(parts)


def _rate(f) -> str:
    """How even the rate was over the timed window (bwopt.measure.episodes)."""
    if f.get("rate_windows") is None:
        return ""
    windows = f"{f['rate_windows']} windows of 0.5 s scatter {f['rate_window_spread'] * 100:.0f} %"
    if not f["slow_episodes"]:
        return f"{windows}; none below 0.6 of their median"
    episodes = "1 slow episode" if f["slow_episodes"] == 1 else f"{f['slow_episodes']} slow episodes"
    return (
        f"{windows}; {episodes} (below 0.6 of their median) took {f['slow_time_fraction'] * 100:.0f} % of "
        f"the timed window, the longest {f['longest_slow_episode_s']:.1f} s: this run's throughput moves "
        "with them; compare settings over repeats (hydra.launcher.repeats)"
    )


# How each part of the step reads in the summary (bwopt.measure.uncertainty.PARTS).
PART_NAMES = {"compute": "compute", "input_stall": "input stall", "host_overhead": "host overhead", "other": "other"}


def _step_partition(f) -> str:
    """'compute 45 % (43–47) + input stall 20 % (18–22) + host overhead 35 % (33–37) = 100 %'."""
    partition = f.get("step_partition")
    if not partition:
        return ""
    intervals = f.get("step_partition_ci95") or {}
    names = dict(PART_NAMES)
    if "input_stall_fraction" not in f:
        names["other"] = "input wait (not split)"
    shown = []
    for part, share in partition.items():
        if share < 0.0005 and part != "compute":
            continue
        low, high = intervals.get(part, (None, None))
        # whole points, unless the interval is narrower than two: then a tenth
        digits = 0 if low is None or round((high - low) * 100, 6) >= 2 else 1
        bounds = f" ({low * 100:.{digits}f}–{high * 100:.{digits}f})" if low is not None else ""
        shown.append(f"{names[part]} {share * 100:.1f} %{bounds}")
    return " + ".join(shown) + f" = {sum(partition.values()) * 100:.0f} % of step time"


def _input_wait(f) -> str:
    if "input_wait_fraction" not in f:
        return ""
    text = f"{f['input_wait_fraction']:.1%}" + _interval(f, "input_wait_fraction_ci95", ".1%")
    text += " of step time in next()"
    if f.get("steps_per_execution", 1) > 1:
        text += " (the executions take their batches inside the graph)"
    return text


def _verdict(f) -> str:
    if not f.get("verdict"):
        return ""
    per_execution = f.get("steps_per_execution", 1)
    return f["verdict"] + (f"  ({per_execution} steps per execution)" if per_execution > 1 else "")


def _ceilings(f) -> str:
    parts = []
    if "compute_ceiling_examples_per_s" in f:
        parts.append(f"compute {f['compute_ceiling_examples_per_s']:,.1f} examples/s{_spread(f, 'compute')}")
    if "input_ceiling_examples_per_s" in f:
        parts.append(f"input {f['input_ceiling_examples_per_s']:,.1f} examples/s{_spread(f, 'input')}")
        if "input_ceiling_bytes_per_s" in f:
            parts[-1] += f" ({f['input_ceiling_bytes_per_s'] / 1e6:,.2f} MB/s)"
    return "  ".join(parts)


def _spread(f, ceiling: str) -> str:
    key = f"{ceiling}_ceiling_spread"
    return f" ± {f[key]:.1%}" if key in f else ""


def _cpu(f) -> str:
    """The cores the run kept busy, measured: the process's CPU time over the timed steps / their
    wall time (every thread: the step's and the input pipeline's)."""
    if f.get("cores_busy") is None:
        return ""
    text = f"{f['cores_busy']:.2f} cores busy" + _interval(f, "cores_busy_ci95", ".2f")
    if "cores_available" in f:
        text += f" of {f['cores_available']:.3g} available"
    return text + f", {f['cpu_s_per_example'] * 1e3:.4f} CPU-ms per example"


def _cores(f) -> str:
    """The cores ceiling: what the cores sustain when every example costs the step's and the
    pipeline's CPU time (the step at least the whole cores it holds for its wall time); named the
    limit when it is below both other ceilings and training is near it. It is an estimate from each
    side's CPU time alone: training has measured up to 1.10 of it."""
    if "cores_ceiling_examples_per_s" not in f:
        return ""
    limit, step, pipeline = (
        f["cores_ceiling_examples_per_s"],
        f["compute_cpu_s_per_example"] * 1e3,
        f["input_cpu_s_per_example"] * 1e3,
    )
    held, compute = f.get("step_cores"), f.get("compute_ceiling_examples_per_s")
    step_text = f"step {step:.4f}"
    if held and held > 1 and compute and held * 1e3 / compute > step:
        step_text += f" (it holds {held} cores for its {1e3 / compute:.4f} ms: {held * 1e3 / compute:.4f})"
        step = held * 1e3 / compute
    cores = limit * (step + pipeline) / 1e3
    text = (
        f"{step_text} + input {pipeline:.4f} CPU-ms per example on {cores:.3g} cores: "
        f"about {limit:,.1f} examples/s together"
    )
    if "cores_efficiency" not in f:
        return text
    text += f"; training {f['cores_efficiency']:.0%} of it"
    others = [f[key] for key in ("compute_ceiling_examples_per_s", "input_ceiling_examples_per_s") if key in f]
    if cores_bound(f.get("throughput_examples_per_s", 0.0), limit, others):
        text += " (every core busy: less CPU per example or more cores, not more overlap)"
    return text


def _efficiency(f) -> str:
    """Above 100 % only with its spread and "within noise": training cannot beat its own ceiling."""
    if "efficiency" not in f:
        return ""
    value, spread = f["efficiency"], f.get("efficiency_spread")
    text = f"{value:.1%}" + (f" ± {spread:.1%}" if spread is not None else "") + " of the lower ceiling"
    if value <= 1.0:
        return text
    if spread is None:
        return "≥ 100% of the lower ceiling (spread not measured; above 100 % is noise)"
    if value - spread <= 1.0:
        return f"{text}: 100 % within noise"
    return f"{text}: above the ceiling by more than its spread (the machine's speed changed between measurements)"


def _memcpy(f) -> str:
    if "host_memcpy_bytes_per_s" not in f:
        return ""
    memcpy = f["host_memcpy_bytes_per_s"]
    text = f"{memcpy / 1e9:,.2f} GB/s"
    if "throughput_bytes_per_s" in f:
        text += f"  (training moves {f['throughput_bytes_per_s'] / memcpy:.3%} of it)"
    return text


def _peak_memory(f) -> str:
    parts = []
    if "peak_host_rss_bytes" in f:
        parts.append(f"host RSS {f['peak_host_rss_bytes'] / 2**20:,.1f} MiB")
    device_peaks = f.get("peak_device_memory_bytes")
    if isinstance(device_peaks, dict):
        parts += [f"{device} {peak / 2**20:,.1f} MiB" for device, peak in device_peaks.items()]
    elif device_peaks is not None:
        parts.append(f"device {device_peaks / 2**20:,.1f} MiB")
    return "  ".join(parts)


def inference_rows(f) -> List[Tuple[str, str]]:
    """One row per batch size found in `inference_bs<N>_...` keys, smallest batch first."""
    batch_sizes = sorted(
        int(key[len("inference_bs") : -len("_examples_per_s")])
        for key in f
        if key.startswith("inference_bs") and key.endswith("_examples_per_s")
    )
    rows = []
    for batch_size in batch_sizes:
        prefix = f"inference_bs{batch_size}_"
        text = f"{f[prefix + 'examples_per_s']:,.1f} examples/s"
        latencies = [
            f"{name} {f[prefix + 'latency_' + name + '_s'] * 1e3:.3f} ms"
            for name in ("p50", "p90", "p99")
            if prefix + "latency_" + name + "_s" in f
        ]
        rows.append((f"inference bs {batch_size}", "  ".join([text, *latencies])))
    return rows


def _recommendation(f) -> str:
    return str(f.get("recommendation", ""))


def _val_accuracy(f) -> str:
    return f"{f['val_accuracy']:.4f}" if "val_accuracy" in f else ""


def _mlflow_run(f) -> str:
    return str(f.get("mlflow_run_id", ""))


MEASURED_ROWS = [
    ("throughput", _throughput),
    ("step time", _step_time),
    ("rate", _rate),
    ("step", _step_partition),
    ("input wait", _input_wait),
    ("verdict", _verdict),
    ("ceilings", _ceilings),
    ("cpu", _cpu),
    ("cores", _cores),
    ("efficiency", _efficiency),
    ("host memcpy", _memcpy),
    ("peak memory", _peak_memory),
]
CLOSING_ROWS = [
    ("val accuracy", _val_accuracy),
    ("recommendation", _recommendation),
    ("MLflow run", _mlflow_run),
]


def print_summary(summary, file: TextIO = sys.stdout) -> None:
    """The end-of-run table of a bwopt.summary.Summary."""
    head = f"bwopt {summary.mode} run {summary.status.lower()}"
    if summary.devices:
        head += f"  ({summary.num_replicas} replica(s) on {', '.join(summary.devices)})"
    figures = {**(asdict(summary.figures) if summary.figures else {}), **summary.measurements}
    figures.update({key: value for key, value in summary.final_metrics.items() if key == "val_accuracy"})
    if summary.recommendation:
        figures["recommendation"] = summary.recommendation
    figures["mlflow_run_id"] = summary.run_id or "(tracking off)"
    print(head + "\n" + figures_table(figures), file=file, flush=True)


def summary_markdown(summary, plots: Sequence[str] = ()) -> str:
    """A bwopt.summary.Summary as Markdown, for the MLflow run's description: the verdict first, the
    recommendation in full, then the figures table and the plots to look at."""
    figures = {**(asdict(summary.figures) if summary.figures else {}), **summary.measurements}
    figures.update({key: value for key, value in summary.final_metrics.items() if key == "val_accuracy"})
    head = f"**bwopt {summary.mode} run {summary.status.lower()}**"
    if summary.devices:
        head += f" on {summary.num_replicas} replica(s): {', '.join(f'`{device}`' for device in summary.devices)}"
    lines = [head, ""]
    if summary.figures and summary.mode == "train":
        lines += [f"**Verdict:** {summary.figures.verdict or summary.figures.input_bound_verdict}", ""]
    if summary.recommendation:
        lines += [f"**Recommendation:** {summary.recommendation}", ""]
    lines += ["| figure | value |", "| --- | --- |"]
    lines += [f"| {label} | {value.replace('|', '/')} |" for label, value in figure_rows(figures)]
    if plots:
        lines += ["", "Plots (artifacts): " + ", ".join(f"`plots/{name}`" for name in plots)]
    return "\n".join(lines)
