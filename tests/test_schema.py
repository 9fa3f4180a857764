"""Config composition and validation: everything here runs without TensorFlow."""

import re
import sys
from pathlib import Path

import pytest
from conftest import compose_config, count_runs, run_bwopt

from bwopt.app import config_dir, validate
from bwopt.schema import Config, ConfigError

GROUPS = ["data", "split", "pipeline", "device", "strategy", "model", "tracking", "cluster"]


def options(group):
    return sorted(path.stem for path in (Path(config_dir()) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(group, option) for group in GROUPS for option in options(group)])
def test_every_option_of_every_group_composes_and_validates(group, option):
    overrides = [f"{group}={option}"]
    if group == "device" and option == "tpu":
        overrides.append("strategy=tpu")
    if group == "strategy" and option == "tpu":
        overrides.append("device=tpu")
    if group == "strategy" and option in ("multi_worker_mirrored", "parameter_server"):
        overrides.append("cluster=local")
    if group == "cluster" and option != "none":
        overrides.append("strategy=multi_worker_mirrored")
    if group == "data" and option in ("artificial", "tfrecord"):
        overrides.append("split=uniform")
    if group == "data" and option == "tfrecord":
        overrides += ["data.file_pattern=/data/*.tfrecord", "data.feature_shape=[8]", "data.num_classes=2"]
    if group == "data" and option == "images":
        overrides.append("data.directory=/data/images")
    if group == "data" and option == "custom":
        overrides += ["split=uniform", "data._target_=bwopt.data.split.shard", "data.num_classes=2"]
    if group == "model" and option == "custom":  # the user's model is required: no default stands in for it
        overrides.append("model._target_=models_fixture.mymodels.small_cnn")
    config = validate(compose_config(overrides))
    assert isinstance(config, Config)
    assert getattr(config, group).name == option


def test_default_config_is_digits_on_cpu_with_mlflow():
    config = validate(compose_config())
    assert (config.data.name, config.device.name, config.strategy.name) == ("digits", "cpu", "default")
    assert config.tracking.uri == "sqlite:///outputs/mlflow.db"
    assert config.tracking.experiment == "bwopt"
    assert config.num_replicas == 1


def test_mirrored_replicas_follow_num_cpu_devices():
    assert validate(compose_config(["strategy=mirrored"])).num_replicas == 2
    assert validate(compose_config(["strategy=mirrored", "device.num_cpu_devices=4"])).num_replicas == 4


@pytest.mark.parametrize(
    "override,expected",
    [
        ("pipeline.prefetch=-1", ["pipeline.prefetch=-1", ">= 0"]),
        ("pipeline.prefetch=fast", ["pipeline.prefetch='fast'", "autotune"]),
        ("pipeline.map_parallelism=0", ["pipeline.map_parallelism=0", ">= 1"]),
        ("pipeline.cache=disk", ["pipeline.cache='disk'", "off, memory, file"]),
        ("pipeline.transfer_dtype=int4", ["pipeline.transfer_dtype='int4'", "uint8, bfloat16"]),
        ("train.global_batch_size=0", ["train.global_batch_size=0", ">= 1"]),
        ("train.optimizer=lbfgs", ["train.optimizer='lbfgs'", "adam, sgd, rmsprop"]),
        ("split.validation_fraction=1.5", ["split.validation_fraction=1.5", "(0, 1)"]),
        ("device.precision=fp8", ["device.precision='fp8'", "float32, mixed_float16"]),
    ],
)
def test_out_of_range_values_name_key_value_and_allowed(override, expected):
    with pytest.raises(ConfigError) as error:
        validate(compose_config([override]))
    for fragment in expected:
        assert fragment in str(error.value)


def test_batch_must_divide_by_replicas():
    with pytest.raises(ConfigError, match=r"global_batch_size=63 is not divisible by the 2 replicas"):
        validate(compose_config(["strategy=mirrored", "train.global_batch_size=63"]))


def test_file_sources_cannot_be_stratified_and_tfrecord_needs_its_files():
    with pytest.raises(ConfigError, match="split=stratified needs the labels in memory.*use split=uniform"):
        validate(compose_config(["data=artificial"]))
    with pytest.raises(ConfigError, match="data.file_pattern is not set and has no default"):
        validate(compose_config(["data=tfrecord", "split=uniform"]))


def test_parameter_server_steps_run_one_per_closure():
    # the coordinator schedules one step per closure: N steps per execution would train 1/N of each epoch
    ps = ["strategy=parameter_server", "cluster=local"]
    with pytest.raises(ConfigError, match="train.steps_per_execution=4 with strategy=parameter_server.*use 1"):
        validate(compose_config([*ps, "train.steps_per_execution=4"]))
    assert validate(compose_config(ps)).train.steps_per_execution == 1


def test_tpu_strategy_needs_tpu_device():
    with pytest.raises(ConfigError, match="strategy=tpu needs device=tpu"):
        validate(compose_config(["strategy=tpu"]))


BAD_COMMAND_LINES = {
    "unknown option": (["strategy=warp"], ["strategy/warp", "default", "mirrored", "one_device"]),
    "unknown key": (["pipeline.prefetchh=2"], ["pipeline.prefetchh", "its keys are: augment_repeats,", " prefetch,"]),
    "unknown nested key": (
        ["pipeline.interleave.cycle_lenght=2"],
        ["pipeline.interleave.cycle_lenght", "block_length, cycle_length, num_parallel_calls"],
    ),
    "wrong type": (["train.epochs=many"], ["train.epochs", "many", "Integer"]),
    "negative prefetch": (["pipeline.prefetch=-3"], ["pipeline.prefetch=-3", ">= 0", "autotune"]),
    "zero batch": (["train.global_batch_size=0"], ["train.global_batch_size=0", ">= 1"]),
    "indivisible batch": (
        ["strategy=mirrored", "device.num_cpu_devices=3", "train.global_batch_size=64"],
        ["global_batch_size=64", "3 replicas", "multiple of 3"],
    ),
}


@pytest.mark.slow  # python -m bwopt in a process
@pytest.mark.parametrize("case", sorted(BAD_COMMAND_LINES))
def test_bad_command_line_fails_fast_without_a_run(case, tmp_path):
    overrides, expected = BAD_COMMAND_LINES[case]
    database = tmp_path / "store.db"
    # PYTHONPROFILEIMPORTTIME makes Python list every module it imports on stderr.
    result = run_bwopt(
        *overrides, f"tracking.uri=sqlite:///{database}", cwd=tmp_path, timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert result.returncode != 0
    for fragment in expected:
        assert fragment in result.stderr, result.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "hydra" in imported and not {"tensorflow", "mlflow", "keras"} & imported
    assert count_runs(database) == 0


@pytest.mark.slow  # fresh processes
def test_validation_and_help_do_not_import_tensorflow(tmp_path):
    probe = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from bwopt.app import config_dir, validate\n"
        "with initialize_config_dir(config_dir=config_dir(), version_base='1.3'):\n"
        "    validate(compose(config_name='config', overrides=['strategy=mirrored']))\n"
        "heavy = [name for name in ('tensorflow', 'mlflow', 'keras') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    import subprocess

    subprocess.run(
        [sys.executable, "-c", probe], check=True, cwd=tmp_path, env={"PYTHONPATH": str(Path(config_dir()).parent)}
    )
    result = run_bwopt("--help", cwd=tmp_path, timeout=60)
    assert result.returncode == 0
    assert result.stdout.startswith("bwopt: measure and optimize")
    # Every group of conf/ with its options as they are chosen, and nothing of the schema's (not a choice).
    conf = Path(config_dir())
    groups = [folder for folder in sorted(conf.iterdir()) if folder.is_dir() and folder.name != "hydra"]
    assert len(groups) >= 10
    for group in groups:
        options = sorted(path.relative_to(group).with_suffix("").as_posix() for path in group.rglob("*.yaml"))
        assert f"\n{group.name}: {', '.join(options)}\n" in result.stdout
    assert "\ntracking: mlflow, none, server/mlflow\n" in result.stdout and "schema" not in result.stdout


def test_every_choice_list_and_its_builder_table_agree():
    """Names live in the schema, builders in their modules: adding an option to one alone fails here."""
    from bwopt import devices, models, modes, strategies, tracking
    from bwopt.data import records, service, sources, split
    from bwopt.schema import (
        CROSS_DEVICE_OPS,
        MODES,
        OPTIMIZERS,
        SCHEMAS,
        SERVICE_COMPRESSIONS,
        SERVICE_PROCESSING_MODES,
        SPLITS,
        TFRECORD_COMPRESSIONS,
    )
    from bwopt.sweep.tune_decide import LEARNING_RATE_RULES

    groups = {
        "data": {**sources.ARRAY_SOURCES, **sources.FILE_SOURCES},
        "device": devices.TARGETS,
        "strategy": strategies.STRATEGIES,
        "model": models.MODELS,
        "tracking": tracking.TRACKERS,
    }
    for group, builders in groups.items():
        assert set(builders) == set(SCHEMAS[group]) == set(options(group)), group
    assert set(SPLITS) == set(split.HOLD_OUTS) == set(split.SHARDINGS) == set(options("split"))
    assert set(MODES) == set(modes.MODES)
    assert set(OPTIMIZERS) == set(models.OPTIMIZERS) == set(LEARNING_RATE_RULES)
    assert set(TFRECORD_COMPRESSIONS) == set(records.OPENERS)
    assert set(SERVICE_PROCESSING_MODES) == set(service.SHARDING_POLICIES)
    assert set(SERVICE_COMPRESSIONS) == set(service.ELEMENT_COMPRESSIONS)
    import inspect

    assert set(CROSS_DEVICE_OPS) <= set(inspect.getsource(strategies.build_mirrored).split('"'))


def test_group_yamls_carry_only_the_keys_of_their_option():
    import yaml

    for option in options("strategy"):
        keys = set(yaml.safe_load((Path(config_dir()) / "strategy" / f"{option}.yaml").read_text())) - {"defaults"}
        fields = set(SCHEMAS_FIELDS("strategy", option))
        assert keys == fields, option


def SCHEMAS_FIELDS(group, option):
    import dataclasses

    from bwopt.schema import SCHEMAS

    return [field.name for field in dataclasses.fields(SCHEMAS[group][option])]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["+pipline.prefetch=2"], "pipline is not a key of 'the config'"),
        (["+pipeline.interleave.cycle=2"], "pipeline.interleave.cycle is not a key of 'pipeline.interleave'"),
        (["train.learning_rate=nan"], "train.learning_rate=nan is not a finite number"),
        (
            ["data=artificial", "split=uniform", "data.element_latency_s=inf"],
            "data.element_latency_s=inf is not a finite",
        ),
        (["seed=-1"], "seed=-1 is out of range"),
        (["tracking.experiment=''"], "tracking.experiment='' names no experiment"),
        (["tracking.uri=sqlite:/x.db"], "a sqlite store is sqlite:///"),
        (["tracking.uri=htp://host"], "unknown scheme 'htp'"),
        (["tracking.uri=http://"], "expected http://host:port"),
        (["+tracking.tags.bad$key=1"], "tracking.tags key 'bad$key' is refused by MLflow"),
        (["mode=inference"], "mode=inference needs measure.inference_batch_sizes"),
    ],
)
def test_values_that_used_to_get_through_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_config(overrides))


RANDOM_IMAGES = ["data=sample_images", "pipeline.preprocess=imagenet", "pipeline.vectorized_map=false"]
TWO_WORKERS = ["strategy=multi_worker_mirrored", "cluster=local"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            [*RANDOM_IMAGES, "pipeline.service.mode=local", "pipeline.service.processing_mode=dynamic"],
            "pipeline.service.processing_mode=dynamic with pipeline.preprocess=imagenet: the service would split",
        ),
        (
            ["pipeline.augment_repeats=2", "pipeline.service.mode=local", "pipeline.service.processing_mode=file"],
            "pipeline.service.processing_mode=file with pipeline.augment_repeats=2",
        ),
        (
            [*RANDOM_IMAGES, "pipeline.service.mode=local", "pipeline.service.processing_mode=distributed_epoch"],
            "use parallel_epochs or data",
        ),
        (
            [*RANDOM_IMAGES, *TWO_WORKERS, "pipeline.distribute.auto_shard_policy=FILE"],
            "pipeline.distribute.auto_shard_policy=FILE with pipeline.preprocess=imagenet: the stream positions",
        ),
    ],
)
def test_a_split_that_would_part_random_draws_from_their_keys_is_refused(overrides, message):
    """A random stage's draws are keyed by the element's position in the stream: sharding that hands
    the positions out apart from the examples (dynamic splits), or by file, is refused."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_config(overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        [*RANDOM_IMAGES, "pipeline.service.mode=local", "pipeline.service.processing_mode=parallel_epochs"],
        [*RANDOM_IMAGES, "pipeline.service.mode=local", "pipeline.service.processing_mode=data"],
        [*RANDOM_IMAGES, *TWO_WORKERS, "pipeline.distribute.auto_shard_policy=AUTO"],
        [*RANDOM_IMAGES, "pipeline.distribute.auto_shard_policy=FILE"],  # one worker: nothing is sharded
        ["pipeline.service.mode=local", "pipeline.service.processing_mode=dynamic"],  # no random stage
        [*TWO_WORKERS, "pipeline.distribute.auto_shard_policy=FILE"],
    ],
)
def test_sharding_that_keeps_random_draws_with_their_keys_is_accepted(overrides):
    validate(compose_config(overrides))


def test_the_random_preprocessings_are_those_with_a_random_training_stage():
    from bwopt.preprocess import PREPROCESSINGS as BUILDERS
    from bwopt.schema.pipeline import RANDOM_PREPROCESSINGS

    assert set(RANDOM_PREPROCESSINGS) == {name for name, (_, random) in BUILDERS.items() if random is not None}


def test_two_runs_in_the_same_second_get_folders_of_their_own():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        folders = {
            OmegaConf.to_container(compose("config", return_hydra_config=True).hydra.run, resolve=True)["dir"]
            for _ in range(3)
        }
    assert len(folders) == 3


@pytest.mark.slow  # python -m bwopt in a process
def test_the_working_directory_as_run_folder_is_refused(tmp_path):
    result = run_bwopt("hydra.run.dir=''", cwd=tmp_path)
    assert result.returncode == 2
    assert "is the working directory" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.slow  # python -m bwopt in a process
def test_a_run_folder_that_cannot_be_made_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "a_file").write_text("")  # a folder cannot be made inside a file, even by root
    result = run_bwopt(f"hydra.run.dir={tmp_path}/a_file/run", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"hydra.run.dir={tmp_path}/a_file/run: {tmp_path}/a_file is a file, not a folder" in result.stderr
