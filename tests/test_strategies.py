"""Strategy and device knobs reach TensorFlow."""

import pytest

from bwopt.schema import MirroredStrategy
from bwopt.strategies import build_strategy

TINY = ["train.epochs=1", "train.warmup_steps=2", "tracking=none", "measure.memcpy_bandwidth=false"]


@pytest.mark.parametrize(
    "name,expected",
    [("reduction_to_one", "ReductionToOneDevice"), ("hierarchical_copy", "HierarchicalCopyAllReduce")],
)
def test_cross_device_ops_are_the_configured_all_reduce(devices, name, expected):
    strategy = build_strategy(MirroredStrategy(cross_device_ops=name), devices)
    assert type(strategy.extended._cross_device_ops).__name__ == expected
    assert strategy.num_replicas_in_sync == 2


def test_one_device_runs_on_the_configured_device(run_experiment):
    summary = run_experiment(*TINY, "strategy=one_device", "strategy.device=/cpu:1")
    assert [device[-5:].upper() for device in summary.devices] == ["CPU:1"]
