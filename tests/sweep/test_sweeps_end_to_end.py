"""`python -m bwopt -m ...` as users run it: bwopt's launcher, real TensorFlow jobs, the report, the parent run."""

import json

import pytest
from conftest import run_bwopt
from mlflow import MlflowClient
from PIL import Image

pytestmark = pytest.mark.slow
TINY = ["train.epochs=1", "train.warmup_steps=2", "train.steps_per_epoch=6", "measure.memcpy_bandwidth=false"]


def the_sweep_dir(cwd):
    (sweep,) = (cwd / "outputs" / "multirun").glob("*/*")
    return sweep


def test_bad_values_in_a_sweep_are_all_reported_before_any_job_starts(tmp_path):
    sweep = ["strategy=mirrored", "train.global_batch_size=32,63", "train.learning_rate=0.01,nan"]
    result = run_bwopt("-m", *sweep, *TINY, cwd=tmp_path)
    assert result.returncode == 2 and "invalid config in 3 of the sweep's jobs; none was started" in result.stderr
    assert result.stderr.count("is not divisible by the 2 replicas") == 2 and "=nan is not a finite" in result.stderr
    assert not list((tmp_path / "outputs").rglob("summary.json")) and not (tmp_path / "outputs" / "mlflow.db").exists()


def test_a_failing_job_is_reported_and_the_sweep_goes_on(tmp_path):
    sweep = [
        "strategy=mirrored",
        "train.optimizer=sgd",
        "train.global_batch_size=32",
        "train.learning_rate=0.01,1e9,0.05",
    ]
    result = run_bwopt("-m", *sweep, *TINY, cwd=tmp_path)
    # job 1 diverges (a NaN loss at once); Hydra then reports the failure
    assert result.returncode != 0 and "training diverged" in result.stderr
    sweep = the_sweep_dir(tmp_path)
    summaries = {n: json.loads((sweep / str(n) / "summary.json").read_text()) for n in (0, 2)}
    assert json.loads((sweep / "1" / "summary.json").read_text())["status"] == "FAILED"

    report = (sweep / "report.md").read_text()
    assert "3 jobs, 1 failed" in report and "**Best overrides:** `strategy=mirrored train.optimizer=sgd" in report
    assert "| 1 | `train.learning_rate=1000000000.0` | **FAILED** (exit code 1) |" in report
    assert len((sweep / "report.csv").read_text().splitlines()) == 1 + 3
    for plot in ("throughput.png", "throughput_vs_train.learning_rate.png"):
        assert (sweep / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(sweep / plot) as image:
            assert image.width >= 600 and image.height >= 200

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bwopt")
    (parent,) = client.search_runs([experiment.experiment_id], "attributes.run_name LIKE 'sweep %'")
    assert parent.info.run_name.startswith("sweep train.learning_rate=0.01,1000000000.0,0.05 · ")  # and its time
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["bwopt.sweep_dir"] == str(sweep.resolve())
    children = [client.get_run(summary["run_id"]) for summary in summaries.values()]
    assert all(child.info.status == "FINISHED" for child in children)
    assert all(child.data.tags["mlflow.parentRunId"] == parent.info.run_id for child in children)
    # Named by the swept key alone; the tag keeps every override.
    names = sorted(child.info.run_name for child in children)
    assert names == ["train.learning_rate=0.01", "train.learning_rate=0.05"]
    assert all("strategy=mirrored" in child.data.tags["bwopt.overrides"] for child in children)
    assert all(child.info.run_id in parent.data.tags["mlflow.note.content"] for child in children)
    artifacts = {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "report.csv", "throughput.png", "throughput_vs_train.learning_rate.png"} <= artifacts


def test_device_sweep_with_repeats_runs_every_job_in_its_own_process_in_rounds(tmp_path):
    sweep_args = ["strategy=mirrored", "device.num_cpu_devices=1,2", "hydra.launcher.repeats=2", "tracking=none"]
    result = run_bwopt("-m", *sweep_args, *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = the_sweep_dir(tmp_path)
    summaries = [json.loads((sweep / str(n) / "summary.json").read_text()) for n in range(4)]
    jobs = [json.loads((sweep / str(n) / "job.json").read_text()) for n in range(4)]
    # TensorFlow fixes its devices once per process: each job got the count it asked for
    assert [len(summary["devices"]) for summary in summaries] == [1, 2, 1, 2]
    assert all(summary["status"] == "FINISHED" for summary in summaries)
    assert [job["repeat"] for job in jobs] == [0, 0, 1, 1]
    assert [job["started_at"] for job in jobs] == sorted(job["started_at"] for job in jobs)  # A B A B

    report = (sweep / "report.md").read_text()
    for count in (1, 2):
        throughputs = [s["figures"]["throughput_examples_per_s"] for s in summaries if len(s["devices"]) == count]
        low, high = min(throughputs), max(throughputs)
        assert (
            f"| `device.num_cpu_devices={count}` | 2/2 | {sum(throughputs) / 2:,.1f} | {low:,.1f}–{high:,.1f} |"
            in report
        )
    assert (sweep / "throughput_vs_device.num_cpu_devices.png").is_file()
