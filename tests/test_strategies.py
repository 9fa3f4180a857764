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


@pytest.mark.slow  # trains for seconds
def test_one_device_runs_on_the_configured_device(run_experiment):
    summary = run_experiment(*TINY, "strategy=one_device", "strategy.device=/cpu:1")
    assert [device[-5:].upper() for device in summary.devices] == ["CPU:1"]


def test_multi_process_strategies_need_a_cluster_and_clusters_need_them():
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.schema import ConfigError

    with pytest.raises(ConfigError, match="strategy=parameter_server runs across processes and needs a cluster"):
        validate(compose_config(["strategy=parameter_server"]))
    with pytest.raises(ConfigError, match="cluster=local with strategy=mirrored"):
        validate(compose_config(["strategy=mirrored", "cluster=local"]))
    config = validate(compose_config(["strategy=multi_worker_mirrored", "cluster=local", "cluster.num_workers=4"]))
    assert config.num_replicas == 4


def test_a_local_parameter_server_cluster_has_a_chief_servers_and_workers_on_loopback():
    import json

    from bwopt.launch import local_tasks, tf_config
    from bwopt.schema import ParameterServerStrategy

    tasks = local_tasks(ParameterServerStrategy(num_ps=2), 2, [5001, 5002, 5003, 5004, 5005])
    assert [task.name for task in tasks] == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    settings = json.loads(tf_config(tasks, tasks[2]))
    assert settings["task"] == {"type": "ps", "index": 1}
    assert settings["cluster"]["worker"] == ["127.0.0.1:5004", "127.0.0.1:5005"]
