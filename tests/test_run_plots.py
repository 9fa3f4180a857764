"""A run's plots from a hand-made step timeline: scales, ticks, legends, windows and the files."""

import numpy as np
import pytest
from PIL import Image

from bwopt.measure import StepPlan, StepTimer, timing_figures
from bwopt.run_plots import ceilings_figure, histogram_figure, step_times_figure, write_plots

CEILINGS = {"compute_ceiling_examples_per_s": 40_000.0, "input_ceiling_examples_per_s": 90_000.0}


@pytest.fixture
def timeline():
    """A 600 ms tracing step, then 199 steps of about 1 ms (0.2 ms of it input wait); the first 2 are warm-up."""
    rng = np.random.default_rng(0)
    timer = StepTimer(
        [0.0] + list(0.0002 + rng.uniform(0, 1e-5, 199)), [0.6] + list(0.0008 + rng.uniform(0, 1e-5, 199))
    )
    plan = StepPlan(1, 200, warmup_steps=2)
    return timer, plan, timing_figures(timer, plan, examples_per_step=32, bytes_per_step=3200)


def assert_legend_off_the_data(figure):
    figure.canvas.draw()
    (axes,) = figure.axes
    legends = [*figure.legends, *([axes.get_legend()] if axes.get_legend() else [])]
    assert legends
    for legend in legends:
        assert not legend.get_window_extent().overlaps(axes.get_window_extent()), legend


def test_the_step_times_scale_is_the_timed_steps_not_the_first_step(timeline):
    timer, plan, figures = timeline
    figure = step_times_figure(timer, plan, figures)
    (axes,) = figure.axes
    bottom, top = axes.get_ylim()
    assert bottom == 0 and 1.0 < top < 1.5  # ~1 ms steps x 1.2, not 600 ms
    labels = figure.legends[0].get_texts()
    assert any("off scale: 1 step, up to 600.0 ms" in text.get_text() for text in labels)
    assert axes.get_title() == "198 timed steps, 0.200 s; y up to p99.5 x 1.2"
    assert_legend_off_the_data(figure)


def test_the_histogram_is_per_training_step_with_the_figures_percentiles_in_range():
    timer = StepTimer([0.0] * 50, [0.3] + [0.004] * 49)  # 2 training steps per loop step: 2 ms each
    plan = StepPlan(1, 50, warmup_steps=1, steps_per_execution=2)
    figures = timing_figures(timer, plan, examples_per_step=8, bytes_per_step=8)
    figure = histogram_figure(timer, plan, figures)
    (axes,) = figure.axes
    low, high = axes.get_xlim()
    assert low == 0 and figures.step_time_p99_s * 1e3 < high < 3.0
    assert axes.get_title() == "98 timed steps, 0.196 s"
    assert_legend_off_the_data(figure)


def test_the_ceilings_plot_starts_at_zero_with_the_training_interval(timeline):
    timer, plan, figures = timeline
    assert ceilings_figure(figures, {}) is None
    figure = ceilings_figure(figures, CEILINGS)
    (axes,) = figure.axes
    assert axes.get_ylim()[0] == 0 and axes.get_ylim()[1] > 90_000
    assert [label.get_text() for label in axes.get_xticklabels()] == ["training", "compute ceiling", "input ceiling"]
    assert len(axes.containers) == 2  # the bars and the training throughput's 95 % whisker
    assert "whisker: training's 95 % interval" in axes.get_title()


def test_write_plots_writes_a_png_per_plot(timeline, tmp_path):
    timer, plan, figures = timeline
    written = write_plots(tmp_path / "plots", timer, plan, figures, CEILINGS)
    assert [path.name for path in written] == [
        "step_times.png",
        "step_time_histogram.png",
        "throughput_vs_ceilings.png",
    ]
    for path in written:
        with Image.open(path) as image:
            assert image.format == "PNG" and 500 <= image.width <= 1200 and 300 <= image.height <= 800
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == sorted(path.name for path in written)


def test_write_plots_removes_its_own_plot_of_an_earlier_call_that_it_does_not_draw_now(timeline, tmp_path):
    timer, plan, figures = timeline
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "throughput_vs_ceilings.png").write_bytes(b"an earlier run measured ceilings")
    (folder / "notes.png").write_bytes(b"not ours")
    written = write_plots(folder, timer, plan, figures, {})
    assert [path.name for path in written] == ["step_times.png", "step_time_histogram.png"]
    assert sorted(path.name for path in folder.iterdir()) == ["notes.png", "step_time_histogram.png", "step_times.png"]
