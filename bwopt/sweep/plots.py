"""The sweep's plots: PNGs of its results (bwopt.sweep.results), drawn with matplotlib's Agg backend.

- `throughput.png`: one bar per setting (override set), labelled by its swept values
  (`prefetch=2`), best on top: the median throughput of its finished repeats, the input-wait share
  of it hatched, each repeat a dot; the whisker is the repeats' min–max, or, for a setting with
  one finished run, that run's 95 % interval (`figures.throughput_examples_per_s_ci95` of its
  summary.json). Failed settings are named at 0;
- `throughput_vs_<key>.png` for each swept numeric key: the settings' medians against its value
  (ticks at the values swept; integer keys get no fractional ticks), one line per combination of
  the other swept keys, with the same whiskers;
- `scaling_efficiency.png` when the jobs ran at several replica counts.

A label longer than `LABEL_CHARS` (a search sweeps ten keys) is wrapped over lines at its spaces
and the figure grows to hold them: on one line it would be wider than the figure, and matplotlib's
layout would give the axes no room at all.

Throughput axes start at 0; legends sit in the figure's margin, off the data; each plot states the
jobs' timed window ("1,723 timed steps, 3.1 s", a range when the jobs differ) under its title.
A report written again removes the plots of these names that it does not draw now (a key no
longer numeric, no scaling), so the folder holds the latest report's plots only.
"""

import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.run_plots import legend_outside, new_figure, remove_stale, save_figure, titled, window_text
from bwopt.sweep.results import OverrideSet, SweepResults, override_values, read_summary

PLOT_PATTERNS = ("throughput.png", "throughput_vs_*.png", "scaling_efficiency.png")
MAX_VALUE_CHARS = 24  # a swept value longer than this is cut in a label
MAX_VALUE_TICKS = 12  # up to this many swept values get a tick each
LABEL_CHARS = 44  # a tick label or legend entry longer than this is wrapped over lines
LINE_IN = 0.17  # inches a line of small text takes


@dataclass
class Setting:
    """One override set as drawn: its throughput's median and whisker, and its runs."""

    label: str  # the swept values, e.g. "prefetch=2 cache=true"
    values: Dict[str, str]  # swept key -> its value
    runs: List[float]  # the finished repeats' throughputs
    num_jobs: int
    input_wait_fraction: Optional[float] = None
    interval: Optional[List[float]] = None  # [low, high] of the whisker
    whisker: str = ""  # "min–max" (repeats), "95 % interval" (one run), "" (none)

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.runs) if self.runs else None


@dataclass
class Window:
    """The jobs' timed windows, as read from their summaries."""

    num_steps: List[int] = field(default_factory=list)
    wall_s: List[float] = field(default_factory=list)

    def text(self) -> str:
        """'1,723 timed steps, 3.1 s', or 'each job: 1,700–1,800 timed steps, 2.9–3.1 s'; '' when unknown."""
        if not self.num_steps:
            return ""
        if len(set(self.num_steps)) == 1 and max(self.wall_s) - min(self.wall_s) < 0.05 * max(self.wall_s):
            return "each job: " + window_text(self.num_steps[0], statistics.median(self.wall_s))
        steps = f"{min(self.num_steps):,}–{max(self.num_steps):,}"
        return f"each job: {steps} timed steps, {min(self.wall_s):,.1f}–{max(self.wall_s):,.1f} s"


def short_keys(keys: Sequence[str]) -> Dict[str, str]:
    """Each key's shortest dotted tail that no other key ends with: 'pipeline.prefetch' -> 'prefetch'."""
    parts = {key: key.lstrip("+~").split(".") for key in keys}
    short = {}
    for key, names in parts.items():
        for length in range(1, len(names) + 1):
            tail = names[-length:]
            if not any(other != key and others[-length:] == tail for other, others in parts.items()):
                break
        short[key] = ".".join(tail)
    return short


def wrapped(label: str) -> str:
    """label over lines of at most LABEL_CHARS, broken at its spaces (a "key=value" is never split)."""
    return textwrap.fill(label, LABEL_CHARS, break_long_words=False, break_on_hyphens=False)


def _cut(value: str) -> str:
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1] + "…"


def read_settings(results: SweepResults) -> List[Setting]:
    """The override sets, fastest first (as ranked), with their labels and whiskers."""
    short = short_keys(results.swept_keys)
    settings = []
    for item in results.sets:
        values = override_values(item.overrides)
        swept = {key: values[key] for key in results.swept_keys if key in values}
        label = " ".join(f"{short[key]}={_cut(value)}" for key, value in swept.items()) or "every job"
        setting = Setting(label, swept, item.throughputs, len(item.jobs), item.median_of("input_wait_fraction"))
        setting.interval, setting.whisker = _whisker(results, item)
        settings.append(setting)
    return settings


def _whisker(results: SweepResults, item: OverrideSet) -> tuple:
    runs = item.throughputs
    if len(runs) > 1:
        return [min(runs), max(runs)], "min–max"
    if len(runs) == 1:
        (job,) = [job for job in item.jobs if job.throughput is not None]
        interval = ((read_summary(results.sweep_dir / job.name) or {}).get("figures") or {}).get(
            "throughput_examples_per_s_ci95"
        )
        if interval and len(interval) == 2:
            return [float(interval[0]), float(interval[1])], "95 % interval"
    return None, ""


def read_window(results: SweepResults) -> Window:
    """The finished jobs' timed steps and seconds (summary.json's num_timed_steps and timed_wall_s)."""
    window = Window()
    for job in results.jobs:
        figures = (read_summary(results.sweep_dir / job.name) or {}).get("figures") or {}
        if job.throughput is not None and figures.get("num_timed_steps") and figures.get("timed_wall_s"):
            window.num_steps.append(int(figures["num_timed_steps"]))
            window.wall_s.append(float(figures["timed_wall_s"]))
    return window


def _subtitle(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def write_plots(results: SweepResults, folder: Path) -> List[Path]:
    """Every plot of the sweep into folder, and its plots of an earlier report that are not drawn now
    removed; returns the paths written."""
    settings, window = read_settings(results), read_window(results).text()
    drawn = {"throughput.png": throughput_figure(settings, window)}
    for key in numeric_keys(settings, results.swept_keys):
        drawn[f"throughput_vs_{key.lstrip('+~')}.png"] = parameter_figure(settings, results.swept_keys, key, window)
    if results.scaling:
        drawn["scaling_efficiency.png"] = scaling_figure(results.scaling, window)
    paths = [save_figure(figure, folder / name) for name, figure in drawn.items()]
    remove_stale(folder, PLOT_PATTERNS, paths)
    return paths


def _whisker_arms(median: float, interval: List[float]) -> List[float]:
    """[below, above] the median, never negative (a 95 % interval need not contain a repeat's median)."""
    return [max(median - interval[0], 0.0), max(interval[1] - median, 0.0)]


def _draw_whiskers(axes, points: List[tuple], horizontal: bool) -> None:
    """points: (position, median, interval, whisker kind); one errorbar call, so one legend entry, per kind."""
    styles = {"min–max": ("black", "-"), "95 % interval": ("0.35", "--")}
    for kind, (color, style) in styles.items():
        chosen = [(position, median, interval) for position, median, interval, whisker in points if whisker == kind]
        if not chosen:
            continue
        positions, medians, intervals = zip(*chosen)
        arms = list(zip(*[_whisker_arms(median, interval) for median, interval in zip(medians, intervals)]))
        label = "min–max over repeats" if kind == "min–max" else "95 % interval (setting with one run)"
        x, y = (medians, positions) if horizontal else (positions, medians)
        key = "xerr" if horizontal else "yerr"
        lines = axes.errorbar(x, y, **{key: arms}, fmt="none", ecolor=color, capsize=4, zorder=4, label=label)
        lines[-1][0].set_linestyle(style)


def throughput_figure(settings: List[Setting], window: str):
    """Per setting, best on top: median throughput split by the input-wait share, repeats as dots, a whisker."""
    rows = list(reversed(settings))  # barh draws bottom-up: best on top
    labels = [wrapped(row.label) for row in rows]
    figure = new_figure(9, 1.6 + sum(max(0.42, LINE_IN * (label.count("\n") + 1) + 0.12) for label in labels))
    axes = figure.add_subplot()
    positions = list(range(len(rows)))
    medians = [row.median or 0.0 for row in rows]
    waiting = [median * (row.input_wait_fraction or 0.0) for median, row in zip(medians, rows)]
    computing = [median - wait for median, wait in zip(medians, waiting)]
    axes.barh(positions, computing, color="tab:blue", label="median: rest of step time (compute, overhead)")
    axes.barh(positions, waiting, left=computing, color="tab:orange", hatch="//", label="median: waiting for input")
    dots = [(run, position) for position, row in enumerate(rows) for run in row.runs if len(row.runs) > 1]
    if dots:
        axes.plot(*zip(*dots), "o", color="white", markeredgecolor="black", markersize=4, zorder=5, label="each run")
    whiskers = [(position, row.median, row.interval, row.whisker) for position, row in enumerate(rows) if row.whisker]
    _draw_whiskers(axes, whiskers, horizontal=True)
    right = max([row.interval[1] if row.interval else row.median or 0.0 for row in rows] + [1e-9])
    for position, row in enumerate(rows):
        if row.median is None:
            axes.text(0, position, f" FAILED ({row.num_jobs}/{row.num_jobs} jobs)", va="center", color="tab:red")
            continue
        end = max(row.median, row.interval[1] if row.interval else 0.0, *row.runs)
        failed = row.num_jobs - len(row.runs)
        runs = f"{len(row.runs)} run{'s' if len(row.runs) > 1 else ''}" + (f", {failed} failed" if failed else "")
        axes.text(end + 0.01 * right, position, f" {row.median:,.0f} ({runs})", va="center", fontsize="small")
    axes.set_yticks(positions, labels, fontsize="small" if any("\n" in label for label in labels) else None)
    axes.set_xlim(0, right * 1.25)  # room for the value labels
    axes.xaxis.set_major_formatter("{x:,.0f}")
    axes.set_xlabel("throughput (examples/s)")
    titled(axes, "Throughput per setting", _subtitle(window, "bars: median of the setting's runs"))
    legend_outside(axes, ncols=2)
    return figure


def _number(value: str) -> Optional[float]:
    try:
        return float(value)
    except ValueError:  # autotune, true, a group option ...
        return None


def numeric_keys(settings: List[Setting], keys: Sequence[str]) -> List[str]:
    """The swept keys whose value is a number in every setting."""
    return [
        key
        for key in keys
        if settings and all(key in item.values and _number(item.values[key]) is not None for item in settings)
    ]


def parameter_figure(settings: List[Setting], keys: Sequence[str], key: str, window: str):
    """The settings' median throughput against key, a line per combination of the other swept keys."""
    short = short_keys(keys)
    others = [other for other in keys if other != key]
    series: Dict[str, List[Setting]] = {}
    for item in settings:
        if item.median is not None:
            label = " ".join(f"{short[other]}={_cut(item.values.get(other, '–'))}" for other in others)
            series.setdefault(wrapped(label) or "median", []).append(item)
    # Long entries (many other keys) go one per row, and the figure grows by the legend's lines.
    long_entries = any("\n" in label for label in series)
    legend_lines = sum(label.count("\n") + 1 for label in series) if long_entries else 0
    figure = new_figure(8, 4.8 + LINE_IN * legend_lines)
    axes = figure.add_subplot()
    for label, items in series.items():
        items.sort(key=lambda item: _number(item.values[key]))
        lines = axes.plot([_number(item.values[key]) for item in items], [item.median for item in items], marker="o")
        lines[0].set_label(label if others else "median of the setting's runs")
    points = [(_number(item.values[key]), item.median, item.interval, item.whisker) for item in settings]
    _draw_whiskers(axes, [point for point in points if point[3]], horizontal=False)  # one legend entry per kind
    _value_ticks(axes, [item.values[key] for item in settings])
    tops = [item.interval[1] if item.interval else item.median or 0.0 for item in settings]
    axes.set_ylim(0, max(tops + [1e-9]) * 1.1)
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.set(xlabel=key, ylabel="throughput (examples/s)")
    failed = sum(item.median is None for item in settings)
    note = f"{failed} failed setting{'s' if failed > 1 else ''} not drawn" if failed else ""
    titled(axes, f"Throughput against {short[key]}", _subtitle(window, note))
    legend_outside(axes, ncols=1 if long_entries else 2)
    return figure


def _value_ticks(axes, texts: List[str]) -> None:
    """Ticks at the swept values when they are few (labelled as written), else integer ticks for integer keys;
    a log scale when positive values span two decades or more."""
    from matplotlib.ticker import MaxNLocator, NullFormatter

    numbers = sorted({_number(text): text for text in texts}.items())
    values = [value for value, _ in numbers]
    log = bool(values) and values[0] > 0 and values[-1] / values[0] >= 100
    if log:
        axes.set_xscale("log")
        axes.xaxis.set_minor_formatter(NullFormatter())
    if len(values) <= MAX_VALUE_TICKS:
        axes.set_xticks(values, [_cut(text) for _, text in numbers])
    elif not log and all(value.is_integer() for value in values):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))


def scaling_figure(scaling: Dict[int, float], window: str):
    """Scaling efficiency against the replica count, with the ideal (1.0) drawn."""
    figure = new_figure(7, 4.8)
    axes = figure.add_subplot()
    counts = sorted(scaling)
    efficiency = [scaling[count] for count in counts]
    axes.plot(counts, efficiency, marker="o", color="tab:blue", label="measured (median throughput per count)")
    axes.axhline(1.0, color="0.5", linestyle="--", label="ideal: N x the one-replica throughput")
    for count, value in zip(counts, efficiency):
        axes.annotate(f"{value:.0%}", (count, value), textcoords="offset points", xytext=(0, 6), ha="center")
    axes.set_xticks(counts, [str(count) for count in counts])
    axes.set_ylim(0, max(1.1, max(efficiency) * 1.15))
    axes.set(xlabel="replicas", ylabel="scaling efficiency")
    titled(axes, "Scaling efficiency: throughput at N / (N x throughput at 1)", window)
    legend_outside(axes)
    return figure
