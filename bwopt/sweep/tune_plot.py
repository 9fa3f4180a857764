"""tune's path as a picture: throughput per trial against the ceilings (matplotlib, Agg)."""

from pathlib import Path
from typing import Sequence

from bwopt.sweep.tune_record import Trial


def plot_path(trials: Sequence[Trial], path: Path) -> Path:
    """Throughput per trial with its interval (kept trials joined: the incumbent's path) against the
    compute, input and cores ceilings each trial measured; the axis starts at 0."""
    from bwopt.run_plots import legend_outside, new_figure, save_figure, titled

    figure = new_figure(7.5, 4.5)
    axes = figure.add_subplot()
    measured = [trial for trial in trials if not trial.failed]
    for trial in measured:
        low, high = trial.ci95 or (trial.throughput, trial.throughput)
        axes.errorbar(
            trial.number,
            trial.throughput,
            # a one-block interval is the throughput itself, up to rounding: never a negative whisker
            yerr=[[max(trial.throughput - low, 0.0)], [max(high - trial.throughput, 0.0)]],
            fmt="o" if trial.kept else "x",
            color="tab:blue" if trial.kept else "tab:gray",
            capsize=3,
        )
    path_trials, incumbent = [], None
    for trial in trials:
        incumbent = trial if trial.kept else incumbent
        if incumbent is not None:
            path_trials.append((trial.number, incumbent.throughput))
    if path_trials:
        axes.step(*zip(*path_trials), where="post", color="tab:blue", label="incumbent (kept trials)")
    lines = (("compute_ceiling", "tab:red"), ("input_ceiling", "tab:green"), ("cores_ceiling", "tab:purple"))
    for name, color in lines:
        points = [(trial.number, getattr(trial, name)) for trial in trials if getattr(trial, name)]
        if points:
            axes.plot(*zip(*points), linestyle="--", marker=".", color=color, label=name.replace("_", " "))
    axes.set_xticks([trial.number for trial in trials])
    axes.set_xlabel("trial")
    axes.set_ylabel("examples/s")
    top = max([trial.ci95[1] if trial.ci95 else trial.throughput for trial in measured] + [1.0])
    ceilings = [trial.ceiling for trial in trials if trial.ceiling]
    axes.set_ylim(0, max(top, min(ceilings) if ceilings else 0) * 1.15)
    titled(axes, "tune: throughput per trial", "dots kept, crosses reverted; whiskers: each trial's 95 % interval")
    legend_outside(axes)
    return save_figure(figure, path)
