"""Whatever tune proposes reads the same examples as the start (tests/test_same_examples.py's check):
every proposal of a plan applied at once, on top of pipeline=naive, with augmentation on."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import compose_config
from test_same_examples import ARTIFICIAL, SYNTHETIC, check, num_train, read, reference  # noqa: F401
from test_tune_decide import artificial_profile, step_bound

from bwopt.app import validate
from bwopt.sweep.tune_decide import BATCH, MAP, SHUFFLE, SOURCE, Budget, Profile, Stage
from bwopt.sweep.tune_plan import plan

# An augmenting in-memory pipeline like experiment=pipelines: every candidate applies.
IMAGES = Profile(
    stages=(
        Stage("source", SOURCE, 0.030, output_bytes_per_example=52),
        Stage("map (cast)", MAP, 0.006, True, False, 196),
        Stage("shuffle, repeat", SHUFFLE, 0.0015, False, True, 196),
        Stage("map (augment)", MAP, 0.110, True, True, 196),
        Stage("batch", BATCH, 0.003, False, True, 196),
    ),
    batch_size=16,
    examples_per_epoch=160,
    step_time_s=0.0096,
    vectorized_map_cost_s=0.060,
    integer_features=True,
    feature_bytes_per_example=196,
    host_overhead_share=0.4,
    steps_per_epoch=10,
    epochs=3,
)


def all_overrides(proposals) -> list:
    merged = {}
    for proposal in proposals:
        merged.update(proposal.overrides)
    return [f"{key}={value}" for key, value in merged.items()]


def test_every_proposal_at_once_reads_the_same_examples(reference):  # noqa: F811
    overrides = all_overrides(plan(IMAGES, Budget(2, 1e9), {}))
    keys = {item.split("=")[0] for item in overrides}
    assert {"pipeline.vectorized_map", "pipeline.map_parallelism", "pipeline.prefetch", "pipeline.cache"} <= keys
    assert "train.steps_per_execution" in keys
    check(reference, SYNTHETIC, "pipeline=naive", *overrides)


def test_the_map_and_the_batch_fused_read_the_same_examples(reference):  # noqa: F811
    """Maps that cannot run on whole batches (as imagenet's crops): the map and the batch fused,
    with the rest of the plan, on pipeline=naive, which turns tf.data's fusion off."""
    profile = replace(IMAGES, vectorized_map_cost_s=None, fused_map_batch_cost_s=0.09)
    overrides = all_overrides(plan(profile, Budget(2, 1e9), {"fused": False}))
    assert "pipeline.options.map_and_batch_fusion=true" in overrides
    check(reference, SYNTHETIC, "pipeline=naive", *overrides)


@pytest.mark.parametrize("epochs", [1, 10])
@pytest.mark.slow
def test_the_file_source_proposals_read_the_same_examples(reference, epochs):  # noqa: F811
    config = validate(
        compose_config(["data=artificial", "split=uniform", "data.num_files=6", "data.step_compute_s=0.008"])
    )
    overrides = all_overrides(plan(artificial_profile(config, epochs=epochs), Budget(2, 1e9), {}))
    assert overrides
    check(reference, ARTIFICIAL, "pipeline=naive", *overrides)


def test_a_larger_batch_takes_the_same_examples_in_the_same_order(reference):  # noqa: F811
    """hydra.sweeper.allow: [batch_size] changes how many examples a step takes, not which ones or in which
    order: the start's stream, shuffled and augmented, read in steps of 64 instead of 16."""
    profile = step_bound(batch_size=16, examples_per_epoch=160, steps_per_epoch=10, warmup_steps=1)
    proposals = plan(profile, Budget(2, 1e9), {}, rejected=["amortise host"], allow=["batch_size"])
    assert proposals[-1].overrides["train.global_batch_size"] == "64"  # 4x the start's 16
    shuffled = [*SYNTHETIC, "pipeline=naive", "pipeline.shuffle_buffer=64", "train.warmup_steps=1"]
    start = validate(compose_config(shuffled))
    larger = validate(compose_config([*shuffled, *all_overrides(proposals)]))
    epochs = 2 * num_train(start)
    start_features, start_labels = read(start, epochs // start.train.global_batch_size)
    features, labels = read(larger, epochs // larger.train.global_batch_size)
    assert np.array_equal(labels, start_labels) and np.array_equal(features, start_features)
