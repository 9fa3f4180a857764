"""The end-of-run table."""

from bwopt.terminal import figure_rows, figures_table, summary_table


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
