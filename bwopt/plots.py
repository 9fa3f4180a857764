"""The pictures of one run, as PNG files (matplotlib, headless): what the figures look like over time.

- `step_times.png`: every step's time split into input wait and compute, in step order, with the
  steps the figures leave out (warm-up, epoch starts, profiled) greyed: an input-bound run is a
  band of input wait under every step;
- `step_time_histogram.png`: the distribution of the timed steps' times, p50 and p99 marked;
- `throughput_vs_ceilings.png` (when ceilings were measured): training throughput next to the
  compute and input ceilings, so the gap to the lower one is efficiency.
"""

from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from bwopt.measure import StepPlan, StepTimer, TimingFigures


def write_plots(
    folder: Path, timer: StepTimer, plan: StepPlan, figures: TimingFigures, measurements: Dict[str, float]
) -> List[Path]:
    """Draw the run's plots into `folder`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to files only
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (
        ("step_times.png", lambda axes: _step_times(axes, timer, plan)),
        ("step_time_histogram.png", lambda axes: _histogram(axes, timer, plan, figures)),
        ("throughput_vs_ceilings.png", lambda axes: _ceilings(axes, figures, measurements)),
    ):
        figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
        try:
            if draw(axes) is False:
                continue
            figure.tight_layout()
            figure.savefig(folder / name)
            written.append(folder / name)
        finally:
            plt.close(figure)
    return written


def _step_times(axes, timer: StepTimer, plan: StepPlan) -> None:
    steps = np.arange(timer.num_steps)
    wait_ms = np.asarray(timer.input_wait_s) * 1e3
    compute_ms = np.asarray(timer.compute_s) * 1e3
    timed = np.zeros(timer.num_steps, dtype=bool)
    timed[plan.timed(timer.num_steps)] = True
    axes.bar(steps, wait_ms, width=1.0, color="tab:orange", label="input wait")
    axes.bar(steps, compute_ms, width=1.0, bottom=wait_ms, color="tab:blue", label="compute")
    for step in steps[~timed]:
        axes.axvspan(step - 0.5, step + 0.5, color="0.85", zorder=0)
    top = np.percentile(wait_ms + compute_ms, 99) * 1.5 if timer.num_steps else 1.0
    axes.set_ylim(0, max(top, 1e-3))  # outliers (the first, tracing step) would flatten the rest
    axes.set(xlabel="step", ylabel="time (ms)", title="Step time: input wait and compute (grey: not timed)")
    axes.legend(loc="upper right")


def _histogram(axes, timer: StepTimer, plan: StepPlan, figures: TimingFigures) -> None:
    kept = plan.timed(timer.num_steps)
    step_ms = (np.asarray(timer.input_wait_s)[kept] + np.asarray(timer.compute_s)[kept]) * 1e3
    axes.hist(step_ms, bins=min(50, max(10, len(step_ms) // 5)), color="tab:blue", alpha=0.8)
    for value, label, style in (
        (figures.step_time_p50_s * 1e3, "p50", "-"),
        (figures.step_time_p99_s * 1e3, "p99", "--"),
    ):
        axes.axvline(value, color="black", linestyle=style, label=f"{label} {value:.3f} ms")
    axes.set(xlabel="step time (ms)", ylabel="timed steps", title=f"Step time of {len(step_ms)} timed steps")
    axes.legend(loc="upper right")


def _ceilings(axes, figures: TimingFigures, measurements: Dict[str, float]) -> Optional[bool]:
    bars = {"training": figures.throughput_examples_per_s}
    for label, key in (
        ("compute ceiling", "compute_ceiling_examples_per_s"),
        ("input ceiling", "input_ceiling_examples_per_s"),
    ):
        if key in measurements:
            bars[label] = measurements[key]
    if len(bars) == 1:
        return False  # no ceiling measured: nothing to compare with
    colors = ["tab:green", "tab:blue", "tab:orange"][: len(bars)]
    axes.bar(list(bars), list(bars.values()), color=colors)
    for index, value in enumerate(bars.values()):
        axes.annotate(f"{value:,.0f}", (index, value), ha="center", va="bottom")
    axes.set(ylabel="examples/s", title="Training throughput against its ceilings")
    return None
