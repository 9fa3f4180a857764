"""data=custom: the user's tf.data function, checked before anything runs, counted once, split by a
seeded hash of the example index."""

import textwrap

import numpy as np
import pytest
from conftest import compose_config

from bwopt.app import validate
from bwopt.data.custom import load_custom
from bwopt.data.records import DataError
from bwopt.schema import ConfigError

MODULE = """
import numpy as np
import tensorflow as tf

CALLS = []


def examples(num_examples=200, num_classes=4):
    CALLS.append(num_examples)
    features = np.arange(num_examples * 6, dtype=np.float32).reshape(num_examples, 2, 3)
    labels = np.arange(num_examples) % num_classes
    return tf.data.Dataset.from_tensor_slices((features, labels))  # int64 labels: bwopt casts them


def train_and_validation():
    return examples(120), examples(40)


def a_list():
    return [1, 2, 3]


def endless():
    return examples(8).repeat()


def ragged_shapes():
    return tf.data.Dataset.range(4).map(lambda n: (tf.zeros([n]), n))


def strings():
    return tf.data.Dataset.from_tensor_slices((["a", "b"], [0, 1]))


NOT_A_FUNCTION = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of the user's, importable as `user_data`, that bwopt has never seen."""
    (tmp_path / "user_data.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_data"
    import sys

    sys.modules.pop("user_data", None)


def custom_config(function, *overrides):
    return validate(
        compose_config(
            ["data=custom", f"data._target_=user_data.{function}", "data.num_classes=4", "split=uniform", *overrides]
        )
    )


def everything(dataset):
    """Sorted first feature value of each example: which examples a dataset holds."""
    return sorted(int(features[0, 0]) for features, _ in dataset.as_numpy_iterator())


@pytest.mark.slow
def test_a_single_dataset_is_counted_once_and_split_by_a_seeded_hash_of_the_index(user_module):
    config = custom_config("examples", "+data.kwargs.num_examples=300")
    source = load_custom(config.data, seed=0, validation_fraction=0.2)
    import user_data

    assert user_data.CALLS == [300]  # called once, with data.kwargs
    train, validation = everything(source.train), everything(source.validation)
    assert (len(train), len(validation)) == (source.num_train_examples, source.num_validation_examples)
    assert not set(train) & set(validation) and sorted(train + validation) == list(range(0, 300 * 6, 6))
    assert 40 <= len(validation) <= 80  # about 20 % of 300
    assert (source.feature_shape, source.feature_dtype, source.num_classes) == ((2, 3), "float32", 4)
    assert source.train.element_spec[1].dtype.name == "int32"
    again = load_custom(config.data, seed=0, validation_fraction=0.2)
    assert everything(again.validation) == validation and everything(again.validation) == validation  # every pass
    assert everything(load_custom(config.data, seed=1, validation_fraction=0.2).validation) != validation


def test_a_train_and_validation_pair_is_taken_as_it_is(user_module):
    source = load_custom(custom_config("train_and_validation").data, seed=0, validation_fraction=0.2)
    assert (source.num_train_examples, source.num_validation_examples) == (120, 40)
    assert len(everything(source.validation)) == 40


@pytest.mark.parametrize(
    "function,overrides,message",
    [
        ("a_list", [], "returned a list; expected a tf.data.Dataset"),
        ("endless", [], "repeats forever; return one epoch"),
        ("ragged_shapes", [], r"features of shape \(None,\); bwopt batches them"),
        ("strings", [], "features of type string; expected numbers"),
        ("examples", ["data.num_classes=3"], r"labels from 0 to 3, outside \[0, data.num_classes=3\)"),
    ],
)
def test_what_bwopt_cannot_use_is_refused_naming_the_target(user_module, function, overrides, message):
    config = custom_config(function, *overrides)
    with pytest.raises(DataError, match=f"data._target_='user_data.{function}'.*{message}"):
        load_custom(config.data, seed=0, validation_fraction=0.2)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["data._target_=user_data.missing"], "module 'user_data' .* defines no 'missing'"),
        (["data._target_=no_such_module.examples"], "no module named 'no_such_module'"),
        (["data._target_=user_data.NOT_A_FUNCTION"], "'NOT_A_FUNCTION' is a constant, not a function"),
        (["data._target_=user_data.examples", "split=stratified"], "split=stratified needs every label before"),
        (["data._target_=user_data.examples", "pipeline.tfrecord.enabled=true"], "pipeline.tfrecord.enabled=true"),
    ],
)
def test_a_bad_target_or_setting_is_refused_before_anything_is_imported(user_module, overrides, message):
    import sys

    with pytest.raises(ConfigError, match=message):
        validate(compose_config(["data=custom", "data.num_classes=4", "split=uniform", *overrides]))
    assert "user_data" not in sys.modules  # found by its syntax tree, not run


@pytest.mark.slow
def test_an_end_to_end_run_on_a_custom_dataset_finishes(user_module, run_experiment):
    summary = run_experiment(
        "tracking=none",
        "data=custom",
        "data._target_=user_data.examples",
        "data.num_classes=4",
        "+data.kwargs.num_examples=400",
        "split=uniform",
        "pipeline=tuned",  # cache, shuffle, vectorised cast, prefetch around the user's dataset
        "pipeline.transfer_dtype=float16",
        "train.global_batch_size=16",
        "train.epochs=2",
        "train.warmup_steps=2",
        "measure.memcpy_bandwidth=false",
    )
    assert summary.status == "FINISHED" and summary.figures.num_timed_steps > 0
    assert np.isfinite(summary.figures.throughput_examples_per_s)
