"""The sweep report on hand-made job folders (no TensorFlow, no launcher)."""

import csv
import json

import pytest
import yaml
from PIL import Image

from bwopt.sweep.report import build_report, main, swept_keys, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_job(sweep, number, overrides, status="FINISHED", throughput=None, input_wait=0.5, exit_code=0, replicas=1):
    """A job folder as bwopt's launcher and runner leave it; status None: no summary.json at all."""
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "job.json").write_text(json.dumps({"num": number, "overrides": overrides, "exit_code": exit_code}))
    if status is None:
        return
    figures = None
    if throughput is not None:
        figures = {
            "throughput_examples_per_s": throughput,
            "input_wait_fraction": input_wait,
            "step_time_p50_s": 0.002,
            "step_time_p99_s": 0.004,
            "input_bound_verdict": "highly input-bound",
        }
    summary = {
        "run_id": f"run{number}",
        "status": status,
        "mode": "train",
        "num_replicas": replicas,
        "devices": ["/device:CPU:0"] * replicas,
        "figures": figures,
        "measurements": {"peak_host_rss_bytes": 2**30, "efficiency": 0.5},
        "final_metrics": {"val_accuracy": 0.9},
    }
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path):
    """prefetch 0, 2, 4 twice over (interleaved), plus a crashed and a failed job of prefetch=8."""
    sweep = tmp_path / "sweep"
    common = ["train.epochs=1"]
    throughputs = {"0": [100.0, 120.0], "2": [300.0, 200.0], "4": [250.0, 260.0]}
    for repeat in range(2):
        for index, prefetch in enumerate(throughputs):
            make_job(
                sweep,
                repeat * 4 + index,
                [f"pipeline.prefetch={prefetch}", *common],
                throughput=throughputs[prefetch][repeat],
            )
    make_job(sweep, 3, ["pipeline.prefetch=8", *common], status=None, exit_code=-9)
    make_job(sweep, 7, ["pipeline.prefetch=8", *common], status="FAILED", exit_code=1)
    return sweep


def test_repeats_fold_into_median_and_spread_ranked_by_throughput(sweep):
    report = build_report(sweep)
    assert swept_keys(report.jobs) == ["pipeline.prefetch"]
    assert [item.overrides[0] for item in report.sets] == [f"pipeline.prefetch={p}" for p in ("4", "2", "0", "8")]
    assert [item.median for item in report.sets] == [255.0, 250.0, 110.0, None]
    assert [(min(item.throughputs), max(item.throughputs)) for item in report.sets[:3]] == [
        (250, 260),
        (200, 300),
        (100, 120),
    ]
    assert report.sets[-1].failed and report.best.overrides == ["pipeline.prefetch=4", "train.epochs=1"]
    assert [job.name for job in report.jobs] == ["1", "6", "2", "5", "4", "0", "3", "7"]
    assert [job.status for job in report.jobs[-2:]] == ["NO SUMMARY", "FAILED"]


def test_files_name_the_best_mark_the_failures_and_plot_every_numeric_key(sweep):
    report = write_report(sweep)
    text = (sweep / "report.md").read_text()
    assert "**Best overrides:** `pipeline.prefetch=4 train.epochs=1`: 255.0 examples/s (median of 2 runs)" in text
    assert "8 jobs, 2 failed. Every job also had `train.epochs=1`." in text
    assert (
        "| 1 | `pipeline.prefetch=4` | 2/2 | 255.0 | 250.0–260.0 | 50.0 | 2.000 | 4.000 | highly input-bound |" in text
    )
    assert "| — | `pipeline.prefetch=8` | 0/2 **FAILED** |" in text
    assert "| 3 | `pipeline.prefetch=8` | **NO SUMMARY** (exit code -9) |" in text
    assert "| 7 | `pipeline.prefetch=8` | **FAILED** (exit code 1) |" in text
    with (sweep / "report.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["job"] for row in rows] == ["1", "6", "2", "5", "4", "0", "3", "7"]
    assert rows[0]["pipeline.prefetch"] == "2" and float(rows[0]["throughput_examples_per_s"]) == 300.0
    assert rows[-2]["status"] == "NO SUMMARY" and rows[-2]["throughput_examples_per_s"] == ""
    plots = [sweep / "throughput.png", sweep / "throughput_vs_pipeline.prefetch.png"]
    assert [path for path in report.files if path.suffix == ".png"] == plots
    for path in plots:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 200


def test_non_numeric_keys_get_no_line_plot_and_a_sweep_with_no_success_has_no_best(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["pipeline=naive"], status="FAILED")
    make_job(sweep, 1, ["pipeline=tuned"], status="FINISHED", throughput=None)  # nothing timed: figures null
    report = write_report(sweep)
    assert report.best is None and all(job.throughput is None for job in report.jobs)
    assert "**No job finished.**" in report.summary
    assert [path.name for path in report.files if path.suffix == ".png"] == ["throughput.png"]


def test_the_command_regenerates_the_report_from_a_sweep_folder(sweep, capsys):
    assert main([str(sweep)]) == 0
    assert "Best overrides" in capsys.readouterr().out
    assert (sweep / "report.md").is_file() and (sweep / "report.csv").is_file()


def test_the_command_rebuilds_a_sweep_from_an_mlflow_parent_run(sweep, tmp_path, mlflow_client, mlflow_uri):
    experiment = mlflow_client.create_experiment("report_from_parent", artifact_location=(tmp_path / "art").as_uri())
    parent = mlflow_client.create_run(experiment, run_name="sweep pipeline.prefetch=0,2").info.run_id
    for number in (0, 1):
        child = mlflow_client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
        mlflow_client.log_artifact(child, str(sweep / str(number) / "summary.json"))
        mlflow_client.log_artifacts(child, str(sweep / str(number) / ".hydra"), ".hydra")
    output = tmp_path / "from_parent"
    assert main(["--tracking-uri", mlflow_uri, "--parent-run-id", parent, "--output", str(output)]) == 0
    report = build_report(output)
    assert [job.overrides[0] for job in report.jobs] == ["pipeline.prefetch=2", "pipeline.prefetch=0"]
    assert (output / "report.md").is_file()


def test_a_sweep_over_replicas_reports_scaling_efficiency_in_its_table_and_a_plot(tmp_path):
    sweep = tmp_path / "scaling"
    for number, (replicas, throughput) in enumerate([(1, 1000.0), (2, 1500.0), (4, 2000.0)]):
        make_job(sweep, number, [f"device.num_cpu_devices={replicas}"], throughput=throughput, replicas=replicas)
    report = write_report(sweep)
    assert report.scaling == {1: 1.0, 2: 0.75, 4: 0.5}
    text = (sweep / "report.md").read_text()
    assert "## Scaling" in text and "| 4 | 2,000.0 | 50.0 |" in text and "| 2 | 1,500.0 | 75.0 |" in text
    assert "2: 75.0" in text  # the override sets' table names each set's replicas and efficiency
    assert (sweep / "scaling_efficiency.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    assert sorted(row["num_replicas"] for row in rows) == ["1", "2", "4"]
