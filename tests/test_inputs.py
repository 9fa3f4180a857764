"""Input planning: sizes and timed steps from the config, before TensorFlow; then real runs that honour them."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import compose_config

from bwopt.app import validate
from bwopt.data.sources import load_digits
from bwopt.inputs import plan, step_plan
from bwopt.schema import ConfigError

TINY = ["train.epochs=2", "train.warmup_steps=3"]


def planned(*overrides):
    return plan(validate(compose_config(list(overrides))), load_digits())


def test_plan_sizes_the_digits_epoch_and_the_transferred_bytes():
    input_plan = planned("pipeline.transfer_dtype=uint8")
    # stratified 20 %: 1,438 training and 359 validation examples; 22 batches of 64.
    assert (input_plan.num_train_examples, input_plan.num_validation_examples) == (1438, 359)
    assert input_plan.steps_per_epoch == 22
    assert input_plan.bytes_per_example == 64 + 4
    assert planned().bytes_per_example == 64 * 4 + 4


def test_step_plan_is_the_one_source_of_timed_steps():
    config = validate(compose_config(["train.epochs=3", "train.warmup_steps=4", "train.epoch_warmup_steps=2"]))
    steps = step_plan(config, 10)
    assert (steps.epochs, steps.steps_per_epoch, steps.warmup_steps, steps.epoch_warmup_steps) == (3, 10, 4, 2)
    assert len(steps.timed()) == 30 - 4 - 2 * 2
    # mode=input iterates the same batches without validation breaks: one epoch, warm-up only.
    config = validate(compose_config(["mode=input", "train.epochs=3", "train.warmup_steps=4"]))
    assert step_plan(config, 10).timed() == list(range(4, 30))


def test_epoch_warmup_defaults_to_the_warmup():
    assert step_plan(validate(compose_config(["train.warmup_steps=4"])), 10).epoch_warmup_steps == 4


def test_uint8_transfer_of_float_features_is_refused():
    with pytest.raises(ConfigError, match="pipeline.transfer_dtype=uint8 would truncate"):
        plan(
            validate(compose_config(["data=synthetic", "data.dtype=float32", "pipeline.transfer_dtype=uint8"])),
            _synthetic(),
        )


def _synthetic():
    from bwopt.data.sources import load_synthetic

    return load_synthetic(validate(compose_config(["data=synthetic", "data.dtype=float32"])).data, 0)


@pytest.mark.slow  # trains for seconds
def test_steps_per_epoch_sets_the_number_of_steps(run_experiment):
    summary = run_experiment("train.warmup_steps=2", "train.steps_per_epoch=7", "train.epochs=2")
    assert summary.figures.num_timed_steps == 2 * 7 - 2 * 2


@pytest.mark.slow  # trains for seconds
@pytest.mark.parametrize(
    "overrides,timed",
    [
        (["train.steps_per_epoch=10", "measure.profile_start_step=7", "measure.profile_num_steps=3"], 2),
        (
            [
                "train.epochs=2",
                "train.steps_per_epoch=10",
                "measure.profile_start_step=12",
                "measure.profile_num_steps=8",
            ],
            5,
        ),
    ],
)
def test_profiling_late_steps_leaves_the_earlier_ones_timed(run_experiment, overrides, timed):
    summary = run_experiment("tracking=none", "train.epochs=1", "train.warmup_steps=5", *overrides)
    assert summary.figures.num_timed_steps == timed


def test_steps_per_execution_plans_whole_executions():
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.inputs import step_plan
    from bwopt.schema import ConfigError

    config = validate(compose_config(["train.steps_per_execution=8", "train.warmup_steps=5", "train.epochs=2"]))
    plan = step_plan(config, 32)
    assert (plan.steps_per_epoch, plan.warmup_steps, plan.epoch_warmup_steps, plan.steps_per_execution) == (4, 1, 1, 8)
    with pytest.raises(ConfigError, match="train.steps_per_epoch=20 is not a multiple of train.steps_per_execution=8"):
        validate(compose_config(["train.steps_per_execution=8", "train.steps_per_epoch=20"]))


def test_a_split_that_holds_out_nothing_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"split.validation_fraction=0.0001 holds out no example"):
        planned("split=uniform", "split.validation_fraction=0.0001")


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["data=synthetic", "data.num_examples=100000", "data.image_shape=[224,224,3]"], "data.num_examples"),
        (["train.global_batch_size=10000000"], "train.global_batch_size=10000000"),
        (["measure.inference_batch_sizes=[1,50000000]"], "measure.inference_batch_sizes=[1, 50000000]"),
    ],
)
def test_data_and_batches_too_large_for_memory_are_refused_before_loading(overrides, key):
    from bwopt.memory import check_fits_in_memory

    config = validate(compose_config(overrides))
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}.* GiB of memory is free; lower it"):
        check_fits_in_memory(config, available_bytes=8 * 2**30)
    check_fits_in_memory(validate(compose_config()), available_bytes=8 * 2**30)  # the default fits


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["data=sample_images", "pipeline.shuffle_buffer=100000000"], "pipeline.shuffle_buffer=100000000"),
        (["data=sample_images", "data.image_size=[64,64]", "pipeline.prefetch=1000000"], "pipeline.prefetch=1000000"),
        (["data=synthetic", "data.image_shape=[64,64,3]", "pipeline.cache=memory"], "pipeline.cache=memory"),
        (["pipeline.distribute.per_replica_buffer_size=100000000"], "pipeline.distribute.per_replica_buffer_size="),
    ],
)
def test_buffers_beyond_memory_are_refused_naming_the_key_and_the_gib(overrides, key):
    from bwopt.memory import buffer_bytes, check_buffers_fit

    config = validate(compose_config(overrides))
    # A 32x32x3 float32 image per element; 40,000 of them for training, as in the crash this prevents.
    input_plan = replace(planned(), num_train_examples=40_000, bytes_per_example=32 * 32 * 3 * 4 + 4)
    sizes = {name: size for name, _, size in buffer_bytes(config, input_plan, input_plan.bytes_per_example)}
    if "shuffle" in key:  # every slot is allocated up front, though an epoch fills 40,000 of them
        assert sizes["pipeline.shuffle_buffer"] == 40_000 * (32 * 32 * 3 * 4 + 4) + 24 * 100_000_000
    available = 512 * 2**20 if "cache" in key else 2 * 2**30
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}.* needs about [\d.,]+ GiB .* GiB of memory is free"):
        check_buffers_fit(config, input_plan, input_plan.bytes_per_example, available_bytes=available)
    check_buffers_fit(validate(compose_config()), input_plan, input_plan.bytes_per_example, available)  # defaults fit


def test_the_services_workers_each_hold_a_shuffle_buffer_and_a_cache_and_remote_ones_none_here():
    from bwopt.memory import buffer_bytes

    input_plan = replace(planned(), num_train_examples=40_000, bytes_per_example=32 * 32 * 3 * 4 + 4)

    def sizes(*overrides):
        config = validate(compose_config(["pipeline.cache=memory", *overrides]))
        return {name: size for name, _, size in buffer_bytes(config, input_plan, input_plan.bytes_per_example)}

    alone = sizes()
    local = sizes("pipeline.service.mode=local", "pipeline.service.num_workers=3")
    remote = sizes("pipeline.service.mode=remote", "pipeline.service.address=grpc://127.0.0.1:5050")
    for key in ("pipeline.shuffle_buffer", "pipeline.cache"):
        assert local[key] == 3 * alone[key] > 0 and remote[key] == 0
    assert local["pipeline.distribute.per_replica_buffer_size"] == alone["pipeline.distribute.per_replica_buffer_size"]


def test_the_memory_free_is_capped_by_an_address_space_limit():
    import resource
    import subprocess
    import sys

    code = (
        "import resource; from bwopt.memory import available_memory_bytes as a; free = a(); "
        "resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, resource.RLIM_INFINITY)); print(free, a())"
    )
    unlimited, limited = map(
        int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
    assert 0 < limited < 2 * 2**30 and limited < unlimited


def cached_examples(prefix: Path) -> int:
    """Examples a complete tf.data file cache holds, read back by tf.data itself."""
    import numpy as np
    import tensorflow as tf

    shape = load_digits().features.shape[1:]
    empty = tf.data.Dataset.from_tensor_slices((np.zeros((0, *shape), np.float32), np.zeros(0, np.int32)))
    return int(empty.cache(str(prefix)).reduce(0, lambda count, _: count + 1))


@pytest.mark.slow  # trains three times
def test_a_file_cache_is_keyed_by_the_split_and_never_read_by_another(tmp_path, run_experiment):
    cache = tmp_path / "cache" / "train"  # its folder does not exist yet: bwopt makes it
    common = ["tracking=none", "train.epochs=2", "pipeline.cache=file", f"pipeline.cache_path={cache}"]
    counts = {}
    for fraction in (0.5, 0.1):
        summary = run_experiment(*common, "split=uniform", f"split.validation_fraction={fraction}")
        indexes = {path.name for path in cache.parent.glob("train-*.index")}
        (new,) = indexes - set(counts)
        own = planned("split=uniform", f"split.validation_fraction={fraction}").num_train_examples
        # Each run trained on its own split (899 and 1,617 of the 1,797 digits), never the other's cache.
        assert cached_examples(cache.parent / new.removesuffix(".index")) == own and summary.figures.num_timed_steps
        counts[new] = own
    assert sorted(counts.values()) == [899, 1617]
    first = sorted(cache.parent.glob("train-*.index"))
    stamps = [path.stat().st_mtime_ns for path in first]
    run_experiment(*common, "split=uniform", "split.validation_fraction=0.1")  # the same settings: read, not rewritten
    assert sorted(cache.parent.glob("train-*.index")) == first and [p.stat().st_mtime_ns for p in first] == stamps


def test_a_file_cache_of_elements_laid_out_otherwise_is_never_read(tmp_path):
    """tf.data reads a cache back without checking its elements: a cache of image elements whose
    identity was a scalar, read where the seeds' [2, 2] part is expected, would broadcast it into
    other crops. The layout is part of the cache's key."""
    import tensorflow as tf

    from bwopt.inputs import Inputs

    config = validate(compose_config(["pipeline.cache=file", f"pipeline.cache_path={tmp_path / 'train'}"]))
    source = load_digits()
    inputs = Inputs(config, source, plan(config, source))
    scalar = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64))
    seeds = (*scalar[:2], tf.TensorSpec([2, 2], tf.int64))
    prefixes = {spec: inputs.pipeline_config(True, 1, 0, spec).cache_path for spec in (scalar, seeds)}
    assert prefixes[scalar] != prefixes[seeds]
    assert inputs.pipeline_config(True, 1, 0, seeds).cache_path == prefixes[seeds]  # the same layout: the same cache


def test_materialised_tfrecords_tell_the_pipeline_their_count(tmp_path):
    """One pipeline reads every shard bwopt wrote: their count is known, so no pass counts them."""
    from bwopt.inputs import Inputs
    from bwopt.pipeline import epoch_size

    config = validate(compose_config(["pipeline.tfrecord.enabled=true", f"pipeline.tfrecord.directory={tmp_path}"]))
    source = load_digits()
    input_plan = plan(config, source)
    elements = Inputs(config, source, input_plan).elements(training=True)
    assert int(elements.cardinality()) == input_plan.num_train_examples == epoch_size(elements)
    assert sum(1 for _ in elements) == input_plan.num_train_examples


@pytest.mark.slow  # trains once
def test_an_unfinished_file_cache_is_removed_and_written_afresh(tmp_path, run_experiment, capfd):
    cache = tmp_path / "train"
    common = ["tracking=none", "train.epochs=2", "pipeline.cache=file", f"pipeline.cache_path={cache}"]
    run_experiment(*common)
    (index,) = tmp_path.glob("train-*.index")
    prefix = str(index).removesuffix(".index")
    # What a writer killed half-way leaves: a lockfile and temporary state, no index.
    for path in tmp_path.glob("train-*"):
        path.unlink()
    Path(f"{prefix}_0.lockfile").write_text("Created at: 1796124903")
    Path(f"{prefix}_0.data-00000-of-00001.tempstate123").write_bytes(b"\0" * 1000)
    capfd.readouterr()
    run_experiment(*common)
    assert "removed the unfinished file cache" in capfd.readouterr().err
    assert cached_examples(Path(prefix)) == 1438 and not list(tmp_path.glob("train-*_0.*"))
