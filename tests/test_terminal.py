"""The progress line (terminals only) and the end-of-run table."""

import io

from bwopt.terminal import ProgressBar, figure_rows, figures_table, summary_table


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand: 10 ms a step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_bar(stream, clock, epochs=2, steps_per_epoch=5):
    bar = ProgressBar(epochs, steps_per_epoch, examples_per_step=32, stream=stream, min_interval_s=0.0, clock=clock)
    for epoch in range(epochs):
        clock.now += 1.0  # validation between epochs: not part of the rate
        bar.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            clock.now += 0.010
            bar.on_step_end(epoch * steps_per_epoch + step)
        bar.on_epoch_end(epoch, {})
    return bar


def test_progress_bar_is_quiet_when_not_a_terminal():
    stream = io.StringIO()
    bar = run_bar(stream, Clock())
    assert not bar.enabled
    assert stream.getvalue() == ""


def test_progress_bar_on_a_terminal_shows_steps_and_live_examples_per_s():
    stream = FakeTerminal()
    run_bar(stream, Clock())
    redraws = stream.getvalue().split("\r")
    # 32 examples every 10 ms is 3,200 examples/s.
    assert "epoch 1/2  step 3/5  [############........]  3,200 examples/s" in redraws
    assert "epoch 2/2  step 5/5  [####################]  3,200 examples/s" in redraws
    # The epoch's end blanks the line (as long as the longest line) so a summary prints cleanly.
    longest = "epoch 2/2  step 5/5  [####################]  3,200 examples/s"
    assert redraws[-2] == " " * len(longest)


def test_progress_bar_redraws_at_most_every_interval_and_always_at_epoch_end():
    stream, clock = FakeTerminal(), Clock()
    bar = ProgressBar(1, 100, examples_per_step=10, stream=stream, min_interval_s=0.1, clock=clock)
    for step in range(100):
        clock.now += 0.004  # 100 steps of 4 ms: 0.4 s, so a redraw about every 25 steps
        bar.on_step_end(step)
    lines = [line for line in stream.getvalue().split("\r") if line]
    assert 4 <= len(lines) <= 5
    assert lines[-1].startswith("epoch 1/1  step 100/100")
    # Every redraw covers 25 steps of 10 examples in 0.1 s: 2,500 examples/s.
    assert all(line.endswith("2,500 examples/s") for line in lines)


def test_summary_table_aligns_the_values():
    table = summary_table([("a", "1"), ("longer label", "2 ms")])
    assert table == "  a             1\n  longer label  2 ms"
    assert summary_table([]) == ""


FIGURES = {
    "throughput_examples_per_s": 36741.6,
    "throughput_bytes_per_s": 9.55e6,
    "step_time_p50_s": 0.001694,
    "step_time_p90_s": 0.002797,
    "step_time_p99_s": 0.004429,
    "step_time_jitter_s": 0.0005,
    "num_timed_steps": 215,
    "input_wait_fraction": 0.59,
    "input_bound_verdict": "highly input-bound",
    "efficiency": 0.8,
    "compute_ceiling_examples_per_s": 90000.0,
    "input_ceiling_examples_per_s": 45927.0,
    "input_ceiling_bytes_per_s": 11.9e6,
    "host_memcpy_bytes_per_s": 4.775e9,
    "peak_host_rss_bytes": 512 * 2**20,
    "peak_device_memory_bytes": {"/device:GPU:0": 3 * 2**30},
    "inference_bs256_examples_per_s": 250000.0,
    "inference_bs256_latency_p50_s": 0.001,
    "inference_bs1_examples_per_s": 2000.0,
    "inference_bs1_latency_p50_s": 0.0005,
    "inference_bs1_latency_p99_s": 0.0007,
    "val_accuracy": 0.91921,
    "recommendation": "highly input-bound: ...; try pipeline=tuned",
    "mlflow_run_id": "0ecedec1",
    "timed_wall_s": 0.36,  # the window, on the step time row
}


def test_the_step_reads_as_a_partition_that_adds_up_with_its_intervals():
    figures = {
        **FIGURES,
        "throughput_examples_per_s_ci95": [35000.0, 38100.0],
        "input_stall_fraction": 0.5,
        "host_overhead_fraction": 0.1,
        "verdict": "highly input-bound",
        "step_partition": {"compute": 0.4, "input_stall": 0.5, "host_overhead": 0.1, "other": 0.0},
        "step_partition_ci95": {"compute": [0.38, 0.43], "input_stall": [0.47, 0.52], "host_overhead": [0.09, 0.11]},
        "input_wait_fraction_ci95": [0.561, 0.612],
    }
    rows = dict(figure_rows(figures))
    assert rows["throughput"] == "36,741.6 examples/s (95 % CI 35,000–38,100)  (9.55 MB/s)"
    assert rows["input wait"] == "59.0% (95 % CI 56.1%–61.2%) of step time in next()"
    assert rows["step"] == (
        "compute 40.0 % (38–43) + input stall 50.0 % (47–52) + host overhead 10.0 % (9–11) = 100 % of step time"
    )
    assert rows["verdict"] == "highly input-bound"
    narrow = {"compute": [0.9770, 0.9812], "input_stall": [0.0150, 0.0190], "host_overhead": [0.003, 0.005]}
    figures["step_partition"] = {"compute": 0.979, "input_stall": 0.017, "host_overhead": 0.004, "other": 0.0}
    figures["step_partition_ci95"] = narrow
    assert dict(figure_rows(figures))["step"] == (
        "compute 97.9 % (97.7–98.1) + input stall 1.7 % (1.5–1.9) + host overhead 0.4 % (0.3–0.5) = 100 % of step time"
    )


def test_a_long_value_wraps_under_its_column():
    advice = "highly input-bound: 61 % of step time waits for input; nothing is cached, try pipeline=tuned " * 2
    lines = summary_table(
        [("throughput", "1 examples/s"), ("recommendation", advice.strip())], line_width=80
    ).splitlines()
    assert len(lines) >= 3 and all(len(line) <= 80 for line in lines)
    assert all(line.startswith(" " * (2 + len("recommendation") + 2)) for line in lines[2:])
    assert " ".join(line.strip() for line in lines[1:]).endswith(advice.strip())


def test_figures_table_formats_every_figure():
    rows = dict(figure_rows(FIGURES))
    assert rows == {
        "throughput": "36,741.6 examples/s  (9.55 MB/s)",
        "step time": "p50 1.694 ms  p90 2.797 ms  p99 4.429 ms  jitter 0.500 ms  (215 timed steps in 0.36 s)",
        "input wait": "59.0% of step time in next()",
        "ceilings": "compute 90,000.0 examples/s  input 45,927.0 examples/s (11.90 MB/s)",
        "efficiency": "80.0% of the lower ceiling",
        # 9.55 MB/s of 4.775 GB/s is 0.2 %.
        "host memcpy": "4.78 GB/s  (training moves 0.200% of it)",
        "peak memory": "host RSS 512.0 MiB  /device:GPU:0 3,072.0 MiB",
        "inference bs 1": "2,000.0 examples/s  p50 0.500 ms  p99 0.700 ms",
        "inference bs 256": "250,000.0 examples/s  p50 1.000 ms",
        "val accuracy": "0.9192",
        "recommendation": "highly input-bound: ...; try pipeline=tuned",
        "MLflow run": "0ecedec1",
    }
    assert [label for label, _ in figure_rows(FIGURES)][6:9] == ["peak memory", "inference bs 1", "inference bs 256"]
    table = figures_table(FIGURES).splitlines()
    # The longest label, "inference bs 256", sets the value column: 2 + 16 + 2 characters in.
    assert table[0] == "  throughput        36,741.6 examples/s  (9.55 MB/s)"
    assert all(line[19] == " " and line[20] != " " for line in table)


def test_figures_table_skips_absent_values():
    rows = figure_rows(
        {
            "throughput_examples_per_s": 1000.0,
            "efficiency": None,
            "host_memcpy_bytes_per_s": 2e9,
            "peak_device_memory_bytes": None,
        }
    )
    assert rows == [("throughput", "1,000.0 examples/s"), ("host memcpy", "2.00 GB/s")]


def test_a_single_device_peak_is_shown_without_a_name():
    assert figure_rows({"peak_device_memory_bytes": 5 * 2**20}) == [("peak memory", "device 5.0 MiB")]
