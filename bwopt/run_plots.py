"""The pictures of one run, as PNG files (matplotlib, headless): what the figures look like over time.

- `step_times.png`: every step's time split into input wait and compute, in step order, with the
  steps the figures leave out (warm-up, epoch starts, profiled) shaded: an input-bound run is a
  band of input wait under every step. The y-scale is set by the timed steps (their p99.5 x 1.2),
  so a slow first (tracing) step does not flatten the rest; steps above it are marked at the top;
- `step_time_histogram.png`: the distribution of the timed steps' times per training step, p50
  and p99 marked (the figures' own); steps beyond the same scale are counted in the last bin;
- `throughput_vs_ceilings.png` (when ceilings were measured): training throughput, with its 95 %
  interval, next to the compute and input ceilings, so the gap to the lower one is efficiency.

Every plot states its window ("1,723 timed steps, 3.1 s") under its title, keeps its legend
outside the data, and starts its throughput and time axes at 0. A folder gets only the plots of
the latest call: one of these files that is not drawn again (no ceilings this time) is removed.

The figure helpers (`new_figure`, `legend_outside`, `save_figure`, `remove_stale`) serve the
sweep's plots (bwopt.sweep.plots) too.
"""

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from bwopt.measure import StepPlan, StepTimer, TimingFigures

PLOT_NAMES = ("step_times.png", "step_time_histogram.png", "throughput_vs_ceilings.png")
# The y-scale of the step times: the timed steps' high percentile, with room above it.
SCALE_PERCENTILE = 99.5
SCALE_HEADROOM = 1.2
COLORS = {"input wait": "tab:orange", "compute": "tab:blue", "untimed": "0.55", "off scale": "tab:red"}


def new_figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (no pyplot, no display) whose layout keeps labels inside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def titled(axes, title: str, subtitle: str) -> None:
    """The figure's title, and under it in small type what the plot covers (its window, its whiskers)."""
    axes.figure.suptitle(title)
    axes.set_title(subtitle, fontsize="small", color="0.3")


def legend_outside(axes, **options):
    """The axes' legend under the plot, in the figure's margin (constrained layout makes room for it): never
    over the data, which `loc="best"` cannot promise for bars."""
    handles, labels = axes.get_legend_handles_labels()
    if not handles:
        return None
    return axes.figure.legend(handles, labels, loc="outside lower center", fontsize="small", **options)


def save_figure(figure, path: Path) -> Path:
    """Write figure as PNG at path: drawn beside it and moved over it, so no reader sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        figure.savefig(partial, format="png", bbox_inches="tight", pad_inches=0.1)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # left only when the drawing failed
    return path


def remove_stale(folder: Path, patterns: Sequence[str], written: Sequence[Path]) -> List[Path]:
    """Remove the files of folder that match patterns (the names a writer owns) but were not written now."""
    keep = {Path(path).name for path in written}
    stale = sorted({path for pattern in patterns for path in folder.glob(pattern) if path.name not in keep})
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def window_text(num_steps: int, wall_s: float) -> str:
    """'1,723 timed steps, 3.1 s'."""
    return f"{num_steps:,} timed step{'s' if num_steps != 1 else ''}, {wall_s:,.{1 if wall_s >= 1 else 3}f} s"


def write_plots(
    folder: Path, timer: StepTimer, plan: StepPlan, figures: TimingFigures, measurements: Dict[str, float]
) -> List[Path]:
    """Draw the run's plots into `folder`; returns the files written (and removes its own older ones)."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn = {
        "step_times.png": step_times_figure(timer, plan, figures),
        "step_time_histogram.png": histogram_figure(timer, plan, figures),
        "throughput_vs_ceilings.png": ceilings_figure(figures, measurements),
    }
    written = [save_figure(figure, folder / name) for name, figure in drawn.items() if figure is not None]
    remove_stale(folder, PLOT_NAMES, written)
    return written


def _step_ms(timer: StepTimer):
    return np.asarray(timer.input_wait_s, dtype=float) * 1e3, np.asarray(timer.compute_s, dtype=float) * 1e3


def scale_top(values_ms: np.ndarray) -> float:
    """The top of a time axis: the high percentile of values, with headroom (1 µs when there are none)."""
    if len(values_ms) == 0:
        return 1e-3
    return max(float(np.percentile(values_ms, SCALE_PERCENTILE)) * SCALE_HEADROOM, 1e-3)


def _runs(mask: np.ndarray) -> List[tuple]:
    """[(first, last)] of the runs of True in mask."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2] - 1))


def step_times_figure(timer: StepTimer, plan: StepPlan, figures: TimingFigures):
    """Every loop step's input wait and compute, stacked; untimed steps shaded, off-scale steps marked."""
    wait_ms, compute_ms = _step_ms(timer)
    total_ms = wait_ms + compute_ms
    steps = np.arange(timer.num_steps)
    timed = np.zeros(timer.num_steps, dtype=bool)
    timed[plan.timed(timer.num_steps)] = True
    top = scale_top(total_ms[timed] if timed.any() else total_ms)
    figure = new_figure(9, 4.5)
    axes = figure.add_subplot()
    # Filled stairs, not bars: thousands of steps stay one polygon each, and no bar edge hides a thin step.
    edges = np.arange(timer.num_steps + 1) - 0.5
    axes.stairs(
        wait_ms, edges, baseline=0, fill=True, color=COLORS["input wait"], antialiased=False, label="input wait"
    )
    axes.stairs(
        total_ms, edges, baseline=wait_ms, fill=True, color=COLORS["compute"], antialiased=False, label="compute"
    )
    for number, (first, last) in enumerate(_runs(~timed)):
        label = "not timed (warm-up, epoch start, profiled)" if number == 0 else None
        axes.axvspan(first - 0.5, last + 0.5, color=COLORS["untimed"], alpha=0.35, linewidth=0, zorder=3, label=label)
    over = total_ms > top
    if over.any():
        label = f"off scale: {int(over.sum())} step{'s' if over.sum() > 1 else ''}, up to {total_ms.max():,.1f} ms"
        axes.plot(
            steps[over], np.full(int(over.sum()), top), "^", color=COLORS["off scale"], clip_on=False, label=label
        )
    axes.set_xlim(-0.5, max(timer.num_steps, 1) - 0.5)
    axes.set_ylim(0, top)
    per = f" (one loop step: {plan.steps_per_execution} training steps)" if plan.steps_per_execution > 1 else ""
    axes.set(xlabel="loop step", ylabel=f"time (ms){per}")
    titled(
        axes,
        "Step time: input wait and compute",
        _window(figures, f"y up to p{SCALE_PERCENTILE:g} x {SCALE_HEADROOM:g}"),
    )
    legend_outside(axes, ncols=2)
    return figure


def _window(figures: TimingFigures, *notes: str) -> str:
    return "; ".join([window_text(figures.num_timed_steps, figures.timed_wall_s), *notes])


def histogram_figure(timer: StepTimer, plan: StepPlan, figures: TimingFigures):
    """The timed steps' times per training step, p50 and p99 marked; the slowest few piled in the last bin."""
    wait_ms, compute_ms = _step_ms(timer)
    kept = plan.timed(timer.num_steps)
    step_ms = (wait_ms[kept] + compute_ms[kept]) / plan.steps_per_execution  # per training step, as p50 and p99
    top = scale_top(step_ms)
    num_over = int((step_ms > top).sum())
    figure = new_figure(8, 4.5)
    axes = figure.add_subplot()
    axes.hist(np.minimum(step_ms, top), bins=min(50, max(10, len(step_ms) // 5)), range=(0, top), color="tab:blue")
    for value, label, style in (
        (figures.step_time_p50_s * 1e3, "p50", "-"),
        (figures.step_time_p99_s * 1e3, "p99", "--"),
    ):
        axes.axvline(value, color="black", linestyle=style, label=f"{label} {value:,.3f} ms")
    axes.set_xlim(0, top)
    counted = "timed loop steps" if plan.steps_per_execution > 1 else "timed steps"
    axes.set(xlabel="step time (ms, per training step)", ylabel=counted)
    notes = [f"{num_over} slower step{'s' if num_over > 1 else ''} counted in the last bin"] if num_over else []
    titled(axes, "Step time distribution", _window(figures, *notes))
    legend_outside(axes, ncols=2)
    return figure


def ceilings_figure(figures: TimingFigures, measurements: Dict[str, float]) -> Optional[object]:
    """Training throughput (with its 95 % interval) next to the ceilings; None when no ceiling was measured."""
    bars = {"training": figures.throughput_examples_per_s}
    for label, key in (
        ("compute ceiling", "compute_ceiling_examples_per_s"),
        ("input ceiling", "input_ceiling_examples_per_s"),
    ):
        if key in measurements:
            bars[label] = measurements[key]
    if len(bars) == 1:
        return None  # no ceiling measured: nothing to compare with
    figure = new_figure(7, 4.5)
    axes = figure.add_subplot()
    positions = np.arange(len(bars))
    axes.bar(positions, list(bars.values()), color=["tab:green", "tab:blue", "tab:orange"][: len(bars)])
    interval = figures.throughput_examples_per_s_ci95
    tops = list(bars.values())
    if interval:
        value = figures.throughput_examples_per_s
        axes.errorbar(
            [0], [value], yerr=[[max(value - interval[0], 0)], [max(interval[1] - value, 0)]], color="black", capsize=6
        )
        tops[0] = max(tops[0], interval[1])
    for position, (value, high) in enumerate(zip(bars.values(), tops)):
        axes.annotate(f"{value:,.0f}", (position, high), xytext=(0, 3), textcoords="offset points", ha="center")
    axes.set_xticks(positions, list(bars))
    axes.set_ylim(0, max(tops) * 1.15)
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.set_ylabel("throughput (examples/s)")
    whisker = "; whisker: training's 95 % interval" if interval else ""
    titled(axes, "Training throughput against its ceilings", _window(figures) + whisker)
    return figure
