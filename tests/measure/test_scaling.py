"""Scaling efficiency on known throughputs."""

import pytest

from bwopt.measure.scaling import scaling_efficiency


def test_scaling_efficiency_is_throughput_over_n_times_one_replica():
    def summary(replicas, throughput):
        return {"num_replicas": replicas, "figures": {"throughput_examples_per_s": throughput}}

    summaries = [summary(1, 100.0), summary(1, 120.0), summary(2, 200.0), summary(4, 220.0), {"figures": None}]
    assert scaling_efficiency(summaries) == {1: pytest.approx(1.0), 2: pytest.approx(200 / 220), 4: 0.5}
    assert scaling_efficiency([summary(2, 200.0)]) == {}
