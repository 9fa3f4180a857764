"""Whatever tune proposes reads the same examples as the start (tests/test_same_examples.py's check):
every proposal of a plan applied at once, on top of pipeline=naive, with augmentation on."""

import pytest
from conftest import compose_config
from test_same_examples import ARTIFICIAL, SYNTHETIC, check, reference  # noqa: F401 (reference: a fixture)
from test_tune_decide import artificial_profile

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


@pytest.mark.parametrize("epochs", [1, 10])
@pytest.mark.slow
def test_the_file_source_proposals_read_the_same_examples(reference, epochs):  # noqa: F811
    config = validate(
        compose_config(["data=artificial", "split=uniform", "data.num_files=6", "data.step_compute_s=0.008"])
    )
    overrides = all_overrides(plan(artificial_profile(config, epochs=epochs), Budget(2, 1e9), {}))
    assert overrides
    check(reference, ARTIFICIAL, "pipeline=naive", *overrides)
