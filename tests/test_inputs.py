"""Input planning: sizes and timed steps from the config, before TensorFlow; then real runs that honour them."""

import re

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


def test_steps_per_epoch_sets_the_number_of_steps(run_experiment):
    summary = run_experiment("train.warmup_steps=2", "train.steps_per_epoch=7", "train.epochs=2")
    assert summary.figures.num_timed_steps == 2 * 7 - 2 * 2


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
    from bwopt.inputs import check_fits_in_memory

    config = validate(compose_config(overrides))
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}.* GiB of memory is free; lower it"):
        check_fits_in_memory(config, available_bytes=8 * 2**30)
    check_fits_in_memory(validate(compose_config()), available_bytes=8 * 2**30)  # the default fits
