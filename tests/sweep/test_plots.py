"""The sweep's plots from hand-made job folders: per-setting medians and whiskers, labels, ticks, axes from 0,
legends off the data, windows, and no plot left from an earlier report."""

import json

import pytest
import yaml
from PIL import Image

from bwopt.sweep.plots import parameter_figure, read_settings, read_window, short_keys, throughput_figure
from bwopt.sweep.report import write_report
from bwopt.sweep.results import read_results


def make_job(sweep, number, overrides, throughput=None, ci95=None, replicas=1):
    """A job folder as the launcher and runner leave it; throughput None: the job failed."""
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    figures = {
        "throughput_examples_per_s": throughput,
        "throughput_examples_per_s_ci95": ci95,
        "input_wait_fraction": 0.25,
        "num_timed_steps": 1723,
        "timed_wall_s": 3.1,
    }
    status = "FAILED" if throughput is None else "FINISHED"
    summary = {"run_id": f"run{number}", "status": status, "num_replicas": replicas, "figures": figures}
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path):
    """device.num_cpu_devices 1 and 2, each run twice; 4 once with a 95 % interval; 3 failed; cache fixed."""
    sweep = tmp_path / "sweep"
    throughputs = {1: [1000.0, 1200.0], 2: [1500.0, 1700.0]}
    for repeat in range(2):
        for index, devices in enumerate(throughputs):
            overrides = [f"device.num_cpu_devices={devices}", "pipeline.cache=true"]
            make_job(sweep, repeat * 2 + index, overrides, throughputs[devices][repeat], replicas=devices)
    make_job(sweep, 4, ["device.num_cpu_devices=4", "pipeline.cache=true"], 2000.0, ci95=[1800.0, 2300.0], replicas=4)
    make_job(sweep, 5, ["device.num_cpu_devices=3", "pipeline.cache=true"])
    return sweep


def assert_legend_off_the_data(figure):
    figure.canvas.draw()
    (axes,) = figure.axes
    assert figure.legends and axes.get_legend() is None
    for legend in figure.legends:
        assert not legend.get_window_extent().overlaps(axes.get_window_extent())


def test_a_setting_is_its_repeats_median_with_their_min_max_or_its_one_runs_interval(sweep):
    settings = read_settings(read_results(sweep))
    assert [item.label for item in settings] == [f"num_cpu_devices={n}" for n in (4, 2, 1, 3)]
    assert [item.median for item in settings] == [2000.0, 1600.0, 1100.0, None]
    assert [item.interval for item in settings] == [[1800.0, 2300.0], [1500.0, 1700.0], [1000.0, 1200.0], None]
    assert [item.whisker for item in settings] == ["95 % interval", "min–max", "min–max", ""]


def test_labels_keep_the_shortest_tail_that_tells_keys_apart():
    keys = ["pipeline.num_parallel_calls", "pipeline.interleave.num_parallel_calls", "+pipeline.prefetch", "model"]
    assert short_keys(keys) == {
        "pipeline.num_parallel_calls": "pipeline.num_parallel_calls",
        "pipeline.interleave.num_parallel_calls": "interleave.num_parallel_calls",
        "+pipeline.prefetch": "prefetch",
        "model": "model",
    }


def test_the_throughput_bars_start_at_zero_best_on_top_with_whiskers_and_the_window(sweep):
    results = read_results(sweep)
    figure = throughput_figure(read_settings(results), read_window(results).text())
    (axes,) = figure.axes
    assert axes.get_xlim()[0] == 0 and axes.get_xlim()[1] >= 2300
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels == [f"num_cpu_devices={n}" for n in (3, 1, 2, 4)]  # bottom-up: the best on top
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "min–max over repeats" in legend and "95 % interval (setting with one run)" in legend
    assert axes.get_title().startswith("each job: 1,723 timed steps, 3.1 s")
    assert_legend_off_the_data(figure)


def test_throughput_against_an_integer_key_has_integer_ticks_and_starts_at_zero(sweep):
    results = read_results(sweep)
    settings = read_settings(results)
    figure = parameter_figure(settings, results.swept_keys, "device.num_cpu_devices", "")
    (axes,) = figure.axes
    assert list(axes.get_xticks()) == [1, 2, 3, 4]  # the values swept, not 1.5 or 2.5
    assert [label.get_text() for label in axes.get_xticklabels()] == ["1", "2", "3", "4"]
    assert axes.get_ylim()[0] == 0 and axes.get_ylim()[1] >= 2300
    assert axes.get_title() == "1 failed setting not drawn"
    assert_legend_off_the_data(figure)


def test_many_integer_values_get_integer_ticks(tmp_path):
    sweep = tmp_path / "sweep"
    for number in range(15):
        make_job(sweep, number, [f"pipeline.prefetch={number}"], 100.0 + number)
    results = read_results(sweep)
    figure = parameter_figure(read_settings(results), results.swept_keys, "pipeline.prefetch", "")
    figure.canvas.draw()
    ticks = figure.axes[0].get_xticks()
    assert len(ticks) > 2 and all(float(tick).is_integer() for tick in ticks)


def test_a_later_report_removes_the_plots_it_no_longer_draws(sweep):
    (sweep / "notes.png").write_bytes(b"not the report's")
    first = write_report(sweep)
    pngs = ["scaling_efficiency.png", "throughput.png", "throughput_vs_device.num_cpu_devices.png"]
    assert sorted(path.name for path in first.files if path.suffix == ".png") == pngs
    for name in pngs:
        with Image.open(sweep / name) as image:
            assert image.format == "PNG" and 500 <= image.width <= 1200 and 250 <= image.height <= 900
    for number in range(6):  # the sweep run again over a group option: no numeric key, one replica count
        (sweep / str(number) / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"pipeline={number % 2}x"]))
        summary = json.loads((sweep / str(number) / "summary.json").read_text())
        (sweep / str(number) / "summary.json").write_text(json.dumps({**summary, "num_replicas": 1}))
    second = write_report(sweep)
    assert [path.name for path in second.files if path.suffix == ".png"] == ["throughput.png"]
    assert sorted(path.name for path in sweep.glob("*.png")) == ["notes.png", "throughput.png"]
    assert not list(sweep.glob(".*partial"))


def test_a_search_of_ten_keys_gets_labels_wrapped_inside_the_figure_and_no_layout_warning(tmp_path):
    """One line of ten 'key=value' pairs is wider than the figure: matplotlib's layout then gives the
    axes no room ("axes sizes collapsed to zero") and the plot is unreadable."""
    import warnings

    sweep = tmp_path / "sweep"
    keys = [f"pipeline.option_number_{index}.setting" for index in range(10)]
    for number in range(6):
        make_job(sweep, number, [f"{key}={number + index}" for index, key in enumerate(keys)], 1000.0 + number)
    results = read_results(sweep)
    settings = read_settings(results)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the collapse is only a UserWarning
        figures = [throughput_figure(settings, ""), parameter_figure(settings, results.swept_keys, keys[0], "")]
        for figure in figures:
            figure.canvas.draw()
    bars = figures[0]
    (axes,) = bars.axes
    labels = axes.get_yticklabels()
    assert all("\n" in label.get_text() for label in labels)
    assert all(max(len(line) for line in label.get_text().splitlines()) <= 44 for label in labels)
    inside = bars.bbox
    for label in labels:
        extent = label.get_window_extent()
        assert extent.x0 >= inside.x0 and extent.x1 <= inside.x1
    assert axes.get_window_extent().width > 0.3 * inside.width  # the bars keep most of the room
    assert_legend_off_the_data(figures[1])
