"""End-to-end runs in this process: real TensorFlow on the bundled digits, a real sqlite MLflow store."""

import json
from pathlib import Path

import pytest
from PIL import Image

from bwopt import train as train_module

TINY = ["train.epochs=2", "train.warmup_steps=3"]


@pytest.mark.slow  # trains for seconds
def test_default_run_learns_digits_and_logs_everything(run_experiment, mlflow_client, tmp_path):
    summary = run_experiment()
    assert summary.status == "FINISHED"
    assert summary.num_replicas == 1
    assert summary.final_metrics["val_accuracy"] >= 0.90

    run = mlflow_client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    experiment = mlflow_client.get_experiment(run.info.experiment_id)
    assert experiment.name == "test_default_run_learns_digits_and_logs_everything"
    params = run.data.params
    assert params["data.name"] == "digits" and params["pipeline.prefetch"] == "autotune"
    assert params["train.global_batch_size"] == "64" and params["model.hidden_units"] == "[128]"
    # Series, one point per epoch at the epoch's number as printed (1..10).
    series = ("loss", "accuracy", "val_loss", "val_accuracy")
    series += ("epoch/throughput_examples_per_s", "epoch/input_wait_pct", "epoch/step_time_p50_ms")
    for key in series:
        history = mlflow_client.get_metric_history(summary.run_id, key)
        assert [point.step for point in history] == list(range(1, 11)), key
    assert run.data.metrics["val_accuracy"] == pytest.approx(summary.final_metrics["val_accuracy"])
    figures = summary.figures
    # MLflow gets readable units (ms, %, MiB), summary.json seconds, fractions and bytes.
    metrics = run.data.metrics
    assert metrics["throughput_examples_per_s"] == pytest.approx(figures.throughput_examples_per_s)
    for name in ("p50", "p90", "p99"):
        assert metrics[f"step_time_{name}_ms"] == pytest.approx(getattr(figures, f"step_time_{name}_s") * 1e3)
    assert metrics["input_wait_pct"] == pytest.approx(figures.input_wait_fraction * 100)
    assert metrics["throughput_mib_per_s"] == pytest.approx(figures.throughput_bytes_per_s / 2**20)
    assert metrics["peak_host_rss_mib"] == pytest.approx(summary.measurements["peak_host_rss_bytes"] / 2**20)
    # The epochs' own throughputs bracket the whole run's.
    epoch_throughputs = [
        point.value for point in mlflow_client.get_metric_history(summary.run_id, "epoch/throughput_examples_per_s")
    ]
    assert min(epoch_throughputs) <= figures.throughput_examples_per_s <= max(epoch_throughputs)
    assert 0 < figures.step_time_p50_s <= figures.step_time_p90_s <= figures.step_time_p99_s
    assert 0 <= figures.input_wait_fraction < 1
    # 1,438 training examples in batches of 64: 22 steps an epoch; the first 5 steps of each of
    # the 10 epochs are warm-up (the pipeline refills during validation).
    assert figures.num_timed_steps == 220 - 10 * 5
    assert run.data.tags["strategy"] == "default" and run.data.tags["num_replicas"] == "1"
    assert run.data.tags["verdict"] == figures.verdict and "input_bound_verdict" not in run.data.tags  # one
    assert run.data.tags["tensorflow_version"].startswith("2.")
    assert run.data.tags["devices"] == "/device:CPU:0"
    artifacts = {item.path for item in mlflow_client.list_artifacts(summary.run_id)}
    assert {"config.yaml", "summary.json", "plots"} <= artifacts
    plots = {item.path for item in mlflow_client.list_artifacts(summary.run_id, "plots")}
    assert plots == {"plots/step_times.png", "plots/step_time_histogram.png"}  # no ceilings measured
    for name in ("step_times.png", "step_time_histogram.png"):
        with Image.open(tmp_path / "run" / "plots" / name) as image:
            assert image.format == "PNG" and image.width >= 600
    # The description answers "why is it slow" in full: the verdict and the whole recommendation.
    description = run.data.tags["mlflow.note.content"]
    assert f"**Verdict:** {figures.verdict}" in description
    assert summary.recommendation in description and "| throughput |" in description
    assert run.data.tags["mlflow.source.name"] and run.data.tags["mlflow.user"]
    assert run.info.run_name == "default"
    # MLflow's own sampler ran: CPU and memory use of the host.
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["run_id"] == summary.run_id and written["status"] == "FINISHED"
    assert written["figures"]["step_time_p50_s"] == figures.step_time_p50_s


@pytest.mark.slow  # trains for seconds
def test_mirrored_runs_two_replicas_on_logical_cpus(run_experiment, mlflow_client):
    summary = run_experiment("strategy=mirrored", "pipeline.prefetch=10", *TINY)
    assert summary.num_replicas == 2
    assert [device[-5:] for device in summary.devices] == ["CPU:0", "CPU:1"]
    run = mlflow_client.get_run(summary.run_id)
    assert run.data.tags["num_replicas"] == "2" and run.data.tags["strategy"] == "mirrored"
    assert run.data.params["pipeline.prefetch"] == "10"


@pytest.mark.slow  # trains for seconds
def test_mirrored_training_matches_single_device_training(run_experiment):
    """Two replicas on half batches each must follow the same trajectory as one replica."""
    exact = ["pipeline.shuffle_buffer=0", "train.epochs=1", "train.warmup_steps=1", "train.optimizer=sgd"]
    single = run_experiment("strategy=one_device", *exact, experiment="same_math")
    mirrored = run_experiment("strategy=mirrored", *exact, experiment="same_math")
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert mirrored.final_metrics[key] == pytest.approx(single.final_metrics[key], rel=1e-4, abs=1e-5)


@pytest.mark.slow  # trains for seconds
def test_cnn_trains_on_digits(run_experiment):
    summary = run_experiment("model=cnn", "train.epochs=3", "train.warmup_steps=3")
    assert summary.status == "FINISHED" and summary.final_metrics["val_accuracy"] > 0.5


@pytest.mark.slow  # trains for seconds
def test_failed_run_is_marked_failed_and_keeps_what_was_measured(run_experiment, mlflow_client, monkeypatch):
    real_evaluate = train_module.evaluate
    calls = []

    def evaluate_then_fail(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("validation shard unreadable")
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", evaluate_then_fail)
    with pytest.raises(OSError, match="validation shard unreadable"):
        run_experiment("train.epochs=3", experiment="failing")
    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("failing").experiment_id])
    assert run.info.status == "FAILED"
    assert len(mlflow_client.get_metric_history(run.info.run_id, "val_accuracy")) == 1
    # Two epochs of steps ran before the failure; their timing is kept.
    assert run.data.metrics["throughput_examples_per_s"] > 0
    assert run.data.metrics["num_timed_steps"] == 2 * (22 - 5)


@pytest.mark.slow  # trains for seconds
def test_tracking_none_runs_without_a_store(run_experiment, tmp_path):
    summary = run_experiment("tracking=none", *TINY)
    assert summary.run_id is None and summary.status == "FINISHED"
    assert (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_config_that_would_time_no_step_is_refused_before_the_run(run_experiment, mlflow_client):
    from bwopt.schema import ConfigError

    with pytest.raises(ConfigError, match="leave no step to time"):
        run_experiment("train.epochs=2", "train.steps_per_epoch=5", "train.warmup_steps=5", experiment="none_timed")
    assert mlflow_client.get_experiment_by_name("none_timed") is None


@pytest.mark.slow  # trains for seconds
def test_secrets_reach_neither_mlflow_nor_the_run_folder_nor_the_terminal(
    run_experiment, mlflow_client, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("BWOPT_TEST_SECRET", "hunter2-from-env")
    summary = run_experiment(
        "+tracking.tags.api_token=hunter2-literal",
        "+tracking.tags.team_password=${oc.env:BWOPT_TEST_SECRET}",
        "train.epochs=1",
        "train.warmup_steps=3",
    )
    run = mlflow_client.get_run(summary.run_id)
    written = [run.data.params, run.data.tags, capsys.readouterr()]
    written += [path.read_text() for path in (tmp_path / "run").rglob("*") if path.suffix in (".yaml", ".json")]
    local = mlflow_client.download_artifacts(summary.run_id, "config.yaml", str(tmp_path / "download"))
    written.append(Path(local).read_text())
    assert not [text for text in map(str, written) if "hunter2" in text]
    assert run.data.params["tracking.tags.api_token"] == "***" and run.data.tags["team_password"] == "***"


def test_redaction_masks_uri_passwords_and_secret_overrides_in_hydra_files(tmp_path):
    import yaml

    from bwopt.redact import redacted_copy

    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text(
        yaml.safe_dump(["tracking.uri=http://alice:s3cret@host:5000", "+tracking.tags.auth_header=xyz", "seed=3"])
    )
    (hydra / "config.yaml").write_text(yaml.safe_dump({"tracking": {"uri": "https://bob:pw@h/"}, "seed": 3}))
    copy = redacted_copy(hydra, tmp_path)
    assert yaml.safe_load((copy / "overrides.yaml").read_text()) == [
        "tracking.uri=http://alice:***@host:5000",
        "+tracking.tags.auth_header=***",
        "seed=3",
    ]
    assert yaml.safe_load((copy / "config.yaml").read_text())["tracking"]["uri"] == "https://bob:***@h/"
