"""The runner's measurement modes and input paths, end to end with real TensorFlow and MLflow."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import experiment_presets

from bwopt.measure.host import available_cores

TINY = ["train.epochs=2", "train.warmup_steps=3"]


@pytest.mark.slow  # trains for seconds
def test_ceilings_efficiency_memory_and_recommendation_are_logged(run_experiment, mlflow_client):
    summary = run_experiment(*TINY, "measure.ceilings=true")
    metrics = mlflow_client.get_run(summary.run_id).data.metrics
    for key in (
        "compute_ceiling_examples_per_s",
        "input_ceiling_examples_per_s",
        "input_ceiling_mib_per_s",
        "efficiency_pct",
        "host_memcpy_mib_per_s",
        "memcpy_share_pct",
        "peak_host_rss_mib",
        "compute_cpu_ms_per_example",
        "input_cpu_ms_per_example",
        "cores_ceiling_examples_per_s",
    ):
        assert metrics[key] > 0, key
    # The step costs its CPU time, or the whole cores it holds for its wall time where that is more.
    step_busy = metrics["compute_cpu_ms_per_example"] / 1e3 * metrics["compute_ceiling_examples_per_s"]
    assert metrics["step_cores"] == min(max(1, round(step_busy)), int(available_cores()))
    held = metrics["step_cores"] / metrics["compute_ceiling_examples_per_s"] if metrics["step_cores"] > 1 else 0.0
    step_s = max(metrics["compute_cpu_ms_per_example"] / 1e3, held)
    cpu_s = step_s + metrics["input_cpu_ms_per_example"] / 1e3
    assert metrics["cores_ceiling_examples_per_s"] == pytest.approx(available_cores() / cpu_s, rel=1e-3)
    assert metrics["cores_efficiency_pct"] == pytest.approx(
        100 * metrics["throughput_examples_per_s"] / metrics["cores_ceiling_examples_per_s"]
    )
    lower = min(metrics["compute_ceiling_examples_per_s"], metrics["input_ceiling_examples_per_s"])
    assert metrics["efficiency_pct"] == pytest.approx(100 * metrics["throughput_examples_per_s"] / lower)
    # Training cannot beat the step alone, nor the lower ceiling, by more than the noise the
    # ceilings state (a step here is about a millisecond: one descheduling moves a block by 40 %).
    compute_high = metrics["compute_ceiling_examples_per_s"] * (1 + metrics["compute_ceiling_spread"])
    assert metrics["throughput_examples_per_s"] < compute_high * 1.1
    assert metrics["efficiency_pct"] - metrics["efficiency_spread_pct"] < 110
    assert metrics["memcpy_share_pct"] == pytest.approx(
        100 * metrics["throughput_mib_per_s"] / metrics["host_memcpy_mib_per_s"]
    )
    artifacts = {item.path for item in mlflow_client.list_artifacts(summary.run_id, "plots")}
    assert "plots/throughput_vs_ceilings.png" in artifacts
    tags = mlflow_client.get_run(summary.run_id).data.tags
    assert summary.recommendation and tags["recommendation"] == summary.recommendation
    assert summary.figures.verdict.split(":")[0] in summary.recommendation


@pytest.mark.slow
def test_input_mode_trains_nothing_and_reports_bytes(run_experiment, mlflow_client):
    summary = run_experiment("mode=input", "train.epochs=1", "pipeline.transfer_dtype=uint8")
    run = mlflow_client.get_run(summary.run_id)
    assert run.data.tags["mode"] == "input" and summary.final_metrics == {}
    assert mlflow_client.get_metric_history(summary.run_id, "loss") == []
    # digits as uint8: 64 feature bytes + a 4-byte label per example.
    assert run.data.metrics["throughput_mib_per_s"] == pytest.approx(
        run.data.metrics["throughput_examples_per_s"] * 68 / 2**20
    )


@pytest.mark.slow  # trains for seconds
def test_inference_after_training_and_inference_mode(run_experiment, mlflow_client):
    trained = run_experiment(*TINY, "measure.inference_batch_sizes=[1,64]", "measure.inference_batches=5")
    metrics = mlflow_client.get_run(trained.run_id).data.metrics
    for size in (1, 64):
        assert metrics[f"inference_bs{size}_examples_per_s"] > 0
        assert metrics[f"inference_bs{size}_latency_p50_ms"] <= metrics[f"inference_bs{size}_latency_p99_ms"]
    fresh = run_experiment("mode=inference", "measure.inference_batch_sizes=[8]", "measure.inference_batches=5")
    assert fresh.measurements["inference_bs8_examples_per_s"] > 0 and fresh.figures is None


@pytest.mark.slow  # trains for seconds
def test_profile_of_a_step_range_is_an_artifact_and_left_out_of_the_figures(run_experiment, mlflow_client):
    summary = run_experiment(*TINY, "measure.profile_start_step=5", "measure.profile_num_steps=2")
    artifacts = [item.path for item in mlflow_client.list_artifacts(summary.run_id, "profile")]
    assert artifacts, "no profile was logged"
    # 2 epochs x 22 steps, minus 3 warm-up steps in each, minus the 2 profiled ones.
    assert summary.figures.num_timed_steps == 2 * (22 - 3) - 2


@pytest.mark.slow  # trains for seconds
@pytest.mark.parametrize("compression", ["NONE", "GZIP"])
def test_tfrecord_materialisation_trains_and_logs_file_figures(run_experiment, mlflow_client, tmp_path, compression):
    summary = run_experiment(
        *TINY,
        "pipeline.tfrecord.enabled=true",
        f"pipeline.tfrecord.compression={compression}",
        f"pipeline.tfrecord.directory='{tmp_path / 'shards'}'",
        "pipeline.tfrecord.num_shards=3",
    )
    metrics = mlflow_client.get_run(summary.run_id).data.metrics
    folders = {
        json.loads(path.read_text())["num_examples"]: path.parent
        for path in (tmp_path / "shards").glob("*/manifest.json")
    }
    num_validation, num_train = sorted(folders)
    assert num_validation + num_train == 1797  # the validation and training splits of digits
    train_files = sorted(folders[num_train].glob("*.tfrecord*"))
    assert len(train_files) == 3
    on_disk = sum(path.stat().st_size for path in train_files)
    assert metrics["tfrecord_on_disk_mib"] == pytest.approx(on_disk / 2**20)
    assert metrics["tfrecord_compression_ratio"] == pytest.approx(num_train * (64 + 4) / on_disk, rel=0.01)
    # One pass over the shards: bytes/s and examples/s describe the same pass.
    assert metrics["tfrecord_read_mib_per_s"] * 2**20 / metrics["tfrecord_read_examples_per_s"] == pytest.approx(
        on_disk / num_train
    )
    assert (metrics["tfrecord_compression_ratio"] > 1.5) == (compression == "GZIP")
    assert summary.final_metrics["val_accuracy"] > 0.5


@pytest.mark.slow  # trains for seconds
def test_user_tfrecord_files_are_a_data_source(run_experiment, tmp_path):
    from bwopt.data.sources import load_digits
    from bwopt.data.tfrecord import materialise

    digits = load_digits()
    files = materialise(digits.features, digits.labels, tmp_path, num_shards=5, compression="ZLIB")
    pattern = str(Path(files.paths[0]).parent / "*")
    summary = run_experiment(
        *TINY,
        "data=tfrecord",
        "split=uniform",
        f"data.file_pattern={pattern}.tfrecord*",
        "data.compression=ZLIB",
        "data.feature_shape=[8,8,1]",
        "data.num_classes=10",
        "data.feature_scale=0.0625",
    )
    # 5 shards of ~360: 4 train the model, the last one validates it.
    assert summary.num_replicas == 1 and summary.final_metrics["val_accuracy"] > 0.5


@pytest.mark.slow  # trains for seconds
def test_distribute_datasets_from_function_gives_per_replica_batches(run_experiment):
    summary = run_experiment(
        *TINY,
        "strategy=mirrored",
        "pipeline.distribute.method=distribute_datasets_from_function",
        "pipeline.distribute.per_replica_buffer_size=2",
    )
    assert summary.num_replicas == 2 and summary.figures.throughput_examples_per_s > 0
    assert summary.final_metrics["val_accuracy"] > 0.5


def test_per_replica_batches_from_the_input_context(devices):
    import tensorflow as tf
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.data.sources import load_digits
    from bwopt.inputs import Inputs, plan
    from bwopt.strategies import distribute_input

    config = validate(
        compose_config(["strategy=mirrored", "pipeline.distribute.method=distribute_datasets_from_function"])
    )
    source = load_digits()
    inputs = Inputs(config, source, plan(config, source))
    strategy = tf.distribute.MirroredStrategy(devices.device_names)
    batch = next(iter(distribute_input(strategy, config.pipeline.distribute, lambda c: inputs.dataset(True, c))))
    features = strategy.experimental_local_results(batch[0])
    assert [tuple(part.shape) for part in features] == [(32, 8, 8, 1), (32, 8, 8, 1)]


@pytest.mark.slow  # seconds of input pipeline
def test_worker_shards_of_the_input_are_disjoint_and_cover_the_split():
    """Two input pipelines (two workers) each read their own shard of the training split."""
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.data.sources import load_digits
    from bwopt.inputs import Inputs, plan

    config = validate(compose_config())
    source = load_digits()
    sizes = plan(config, source)
    inputs = Inputs(config, source, sizes)
    parts = [[int(label) for _, label in inputs.elements(True, 2, index)] for index in range(2)]
    counts = [np.bincount(part, minlength=10) for part in parts]
    assert len(parts[0]) + len(parts[1]) == len(sizes.train_indices)
    assert np.all(np.abs(counts[0] - counts[1]) <= 1)  # stratified shards


@pytest.mark.slow  # trains for seconds
@pytest.mark.parametrize("preset", experiment_presets())
def test_every_experiment_preset_runs_shrunk(run_experiment, preset):
    shrink = ["train.epochs=1", "train.warmup_steps=1", "measure.memcpy_bandwidth=false"]
    if preset in ("mirrored", "pipelines", "transfer_dtype", "memory_growth", "scaling"):
        shrink += ["data.num_examples=256", "data.image_shape=[16,16,3]", "train.global_batch_size=32"]
    if preset == "prefetch":
        shrink += ["data.num_files=2", "data.examples_per_file=64", "data.step_compute_s=0.001"]
    if preset == "memory_growth":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            from bwopt.devices import DeviceError

            with pytest.raises(DeviceError, match="sees no GPU"):
                run_experiment(f"experiment={preset}", *shrink)
            return
    summary = run_experiment(f"experiment={preset}", *shrink)
    assert summary.status == "FINISHED" and summary.figures.num_timed_steps > 0


@pytest.mark.slow  # seconds of input pipeline
@pytest.mark.parametrize("fetch_to_device", [True, False])
def test_input_options_reach_the_distributed_dataset(devices, fetch_to_device):
    import tensorflow as tf
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.data.sources import load_digits
    from bwopt.inputs import Inputs, plan
    from bwopt.strategies import distribute_input

    config = validate(
        compose_config(
            [
                "strategy=mirrored",
                f"pipeline.distribute.fetch_to_device={fetch_to_device}",
                "pipeline.distribute.per_replica_buffer_size=3",
            ]
        )
    )
    source = load_digits()
    inputs = Inputs(config, source, plan(config, source))
    strategy = tf.distribute.MirroredStrategy(devices.device_names)
    distributed = distribute_input(strategy, config.pipeline.distribute, lambda c: inputs.dataset(True, c))
    assert distributed._options.experimental_per_replica_buffer_size == 3
    placed = [part.device[-5:] for part in strategy.experimental_local_results(next(iter(distributed))[0])]
    # Fetched to each replica's device, or left on the host (the first CPU) for the step to copy.
    assert placed == (["CPU:0", "CPU:1"] if fetch_to_device else ["CPU:0", "CPU:0"])


@pytest.mark.slow  # trains for seconds
def test_a_file_source_is_materialised_too(run_experiment, tmp_path):
    """The artificial source, read once (its latencies paid once), then served from TFRecord shards."""
    summary = run_experiment(
        "data=artificial",
        "split=uniform",
        "data.num_files=4",
        "data.examples_per_file=64",
        "data.element_latency_s=0.002",
        "train.global_batch_size=16",
        "train.epochs=2",
        "train.warmup_steps=2",
        "pipeline.tfrecord.enabled=true",
        f"pipeline.tfrecord.directory='{tmp_path}'",
        "pipeline.tfrecord.num_shards=2",
    )
    manifests = sorted(tmp_path.glob("*/manifest.json"))
    assert len(manifests) == 2  # train and validation
    # 2 ms per element is gone: 16-example batches now take far less than 32 ms.
    assert summary.figures.step_time_p50_s < 0.010
    assert summary.measurements["tfrecord_on_disk_bytes"] > 0
