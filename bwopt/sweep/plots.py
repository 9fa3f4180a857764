"""PNG plots of a sweep report, drawn with matplotlib's Agg backend (no display needed)."""

from pathlib import Path
from typing import Dict, List, Optional

from bwopt.sweep.report import Report, override_values


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _as_number(value: str) -> Optional[float]:
    try:
        return float(value)
    except ValueError:  # autotune, true, a group option ...
        return None


def _swept_values(overrides: List[str], keys: List[str]) -> str:
    values = override_values(overrides)
    return " ".join(values[key] for key in keys if key in values)


def plot_throughput(report: Report, path: Path) -> Path:
    """Throughput per job, best first: the input-wait share of it hatched on top; failed jobs marked."""
    pyplot = _pyplot()
    jobs = list(reversed(report.jobs))  # barh draws bottom-up: best on top
    figure, axes = pyplot.subplots(figsize=(9, 1.2 + 0.45 * len(jobs)))
    labels = [f"#{job.name} {_swept_values(job.overrides, report.swept_keys)}" for job in jobs]
    throughput = [job.throughput or 0.0 for job in jobs]
    waiting = [value * (job.figures.get("input_wait_fraction") or 0.0) for value, job in zip(throughput, jobs)]
    computing = [value - wait for value, wait in zip(throughput, waiting)]
    axes.barh(labels, computing, color="tab:blue", label="rest of step time (compute, overhead)")
    axes.barh(labels, waiting, left=computing, color="tab:orange", hatch="//", label="waiting for input")
    for row, job in enumerate(jobs):
        if job.failed:
            axes.text(0, row, f"  {job.status}", va="center", color="tab:red")
    axes.set_xlabel("throughput (examples/s)")
    axes.set_ylabel("job: " + " ".join(report.swept_keys))
    axes.set_title("throughput per job, split by share of step time")
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def plot_parameters(report: Report, folder: Path) -> List[Path]:
    """For each swept key whose values are all numbers: median throughput against it, min-max as error bars."""
    paths = []
    for key in report.swept_keys:
        values = {tuple(item.overrides): override_values(item.overrides).get(key) for item in report.sets}
        if any(value is None or _as_number(value) is None for value in values.values()):
            continue
        paths.append(_plot_parameter(report, key, folder / f"throughput_vs_{key.lstrip('+~')}.png"))
    return paths


def _plot_parameter(report: Report, key: str, path: Path) -> Path:
    pyplot = _pyplot()
    others = [other for other in report.swept_keys if other != key]
    series: Dict[str, list] = {}  # one line per combination of the other swept keys
    for item in report.sets:
        if item.failed:
            continue
        values = override_values(item.overrides)
        label = " ".join(f"{other}={values.get(other, '')}" for other in others) or "median"
        series.setdefault(label, []).append(
            (_as_number(values[key]), item.median, min(item.throughputs), max(item.throughputs))
        )
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        points.sort()
        x, median, low, high = zip(*points)
        spread = [[m - lo for m, lo in zip(median, low)], [hi - m for m, hi in zip(median, high)]]
        axes.errorbar(x, median, yerr=spread, marker="o", capsize=4, label=label)
    axes.set_xlabel(key)
    axes.set_ylabel("throughput (examples/s), median; bars: min–max")
    axes.set_title(f"throughput vs {key}")
    if series:
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def plot_scaling(report: Report, path: Path) -> Path:
    """Scaling efficiency against the replica count, with the ideal (1.0) drawn."""
    pyplot = _pyplot()
    scaling = report.scaling
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    counts = list(scaling)
    axes.plot(counts, [scaling[count] for count in counts], marker="o", color="tab:blue", label="measured")
    axes.axhline(1.0, color="0.5", linestyle="--", label="ideal: N x the one-replica throughput")
    for count in counts:
        axes.annotate(
            f"{scaling[count]:.0%}", (count, scaling[count]), textcoords="offset points", xytext=(0, 6), ha="center"
        )
    axes.set_xticks(counts)
    axes.set_ylim(0, max(1.1, max(scaling.values()) * 1.1))
    axes.set(xlabel="replicas", ylabel="scaling efficiency", title="throughput at N / (N x throughput at 1)")
    axes.legend(loc="lower left", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
