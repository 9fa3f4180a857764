"""The tf.data service on real servers.

TensorFlow's tf.data service servers listen on 0.0.0.0 whatever the config says, so the tests that
start servers run in a child process (this file run as a script) inside a private network
namespace whose only interface is loopback: nothing they open is reachable from outside.
"""

import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from bwopt.data.service import LocalDataService, distribute, non_loopback_addresses

REPO = Path(__file__).resolve().parents[2]
NETWORK_NAMESPACE = ["unshare", "--user", "--map-root-user", "--net"]
RESULT_PREFIX = "SCENARIOS "


def bring_up_loopback() -> None:
    """`ip link set lo up` without iproute2: a new network namespace starts with lo down."""
    get_flags, set_flags, interface_up = 0x8913, 0x8914, 0x1  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP
    request = struct.Struct("16sH22x")  # struct ifreq: name, then ifr_flags in a 24-byte union
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        flags = request.unpack(fcntl.ioctl(control, get_flags, request.pack(b"lo", 0)))[1]
        fcntl.ioctl(control, set_flags, request.pack(b"lo", flags | interface_up))


def listening_sockets():
    return sorted(
        [connection.laddr.ip, connection.laddr.port]
        for connection in psutil.Process().net_connections(kind="inet")
        if connection.status == psutil.CONN_LISTEN
    )


def port_accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except ConnectionRefusedError:
        return False


def port_can_be_bound(port: int) -> bool:
    # SO_REUSEADDR: closed connections in TIME_WAIT may hold the port, a listener may not.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def run_scenarios() -> dict:
    """Everything that needs running servers; runs in the child, inside the namespace."""
    import tensorflow as tf

    def elements(service, processing_mode, compression):
        dataset = distribute(tf.data.Dataset.range(100), service.address, processing_mode, None, compression)
        return sorted(int(value) for value in dataset.as_numpy_iterator())

    results = {"interfaces": sorted(psutil.net_if_addrs()), "listening_before": listening_sockets()}
    with LocalDataService(num_workers=2) as service:
        ports = [service.dispatcher_port] + [int(a.rsplit(":", 1)[1]) for a in service.worker_addresses]
        results.update(
            address=service.address,
            worker_addresses=service.worker_addresses,
            ports=ports,
            listening=listening_sockets(),
            accepting=[port_accepts_connections(port) for port in ports],
            distributed_epoch=elements(service, "distributed_epoch", "AUTO"),
            dynamic=elements(service, "dynamic", "NONE"),
            parallel_epochs=elements(service, "parallel_epochs", "AUTO"),
            data=elements(service, "data", "SNAPPY"),
        )
    results.update(
        listening_after=listening_sockets(),
        accepting_after=[port_accepts_connections(port) for port in ports],
        bindable_after=[port_can_be_bound(port) for port in ports],
    )
    return results


@pytest.fixture(scope="module")
def scenarios():
    """The results of `run_scenarios` in a child process in a loopback-only network namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux `unshare` to give the servers a loopback-only network namespace")
    probe = subprocess.run([*NETWORK_NAMESPACE, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a user + network namespace here: {probe.stderr.strip()}")
    child = subprocess.run(
        [*NETWORK_NAMESPACE, sys.executable, __file__],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.returncode == 0, child.stderr[-4000:]
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


@pytest.mark.slow  # servers in a child process
@pytest.mark.parametrize("mode", ["distributed_epoch", "dynamic", "data"])
def test_a_shared_epoch_over_two_workers_yields_each_element_once(scenarios, mode):
    assert scenarios[mode] == list(range(100))


@pytest.mark.slow  # servers in a child process
def test_parallel_epochs_on_two_workers_yield_each_element_twice(scenarios):
    values, counts = np.unique(scenarios["parallel_epochs"], return_counts=True)
    assert values.tolist() == list(range(100))
    assert set(counts.tolist()) == {2}


@pytest.mark.slow  # servers in a child process
def test_the_servers_are_reachable_on_loopback_only(scenarios):
    dispatcher_port, *worker_ports = scenarios["ports"]
    assert scenarios["address"] == f"grpc://127.0.0.1:{dispatcher_port}"
    assert scenarios["worker_addresses"] == [f"127.0.0.1:{port}" for port in worker_ports]
    assert scenarios["interfaces"] == ["lo"]
    assert scenarios["listening_before"] == []
    # Exactly our three ports listen, and in this namespace a wildcard address means loopback.
    assert sorted(port for _, port in scenarios["listening"]) == sorted(scenarios["ports"])
    assert {ip for ip, _ in scenarios["listening"]} <= {"127.0.0.1", "::1", "0.0.0.0", "::"}
    assert scenarios["accepting"] == [True, True, True]


@pytest.mark.slow  # servers in a child process
def test_leaving_the_service_closes_every_port(scenarios):
    assert scenarios["listening_after"] == []
    assert scenarios["accepting_after"] == [False, False, False]
    assert scenarios["bindable_after"] == [True, True, True]


def test_it_refuses_to_start_where_the_servers_would_be_reachable_from_outside():
    exposed = non_loopback_addresses()
    if not exposed:
        pytest.skip("this process has only loopback addresses, where starting is allowed")
    listening = listening_sockets()
    with pytest.raises(RuntimeError, match="listen on 0.0.0.0.*pipeline.service.allow_external_interfaces=true"):
        with LocalDataService(num_workers=1):
            pass
    assert listening_sockets() == listening


@pytest.mark.slow  # python -m bwopt in a process
def test_a_local_service_that_would_be_exposed_ends_the_run_before_it_starts(tmp_path):
    """One line, exit code 3, and no MLflow run that only records where the machine is."""
    from conftest import run_bwopt

    if not non_loopback_addresses():
        pytest.skip("this process has only loopback addresses, where starting is allowed")
    result = run_bwopt("pipeline.service.mode=local", cwd=tmp_path)
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "pipeline.service.allow_external_interfaces=true" in result.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.parametrize(
    "processing_mode, compression, message",
    [
        ("sideways", "AUTO", "'sideways'; expected one of: parallel_epochs, distributed_epoch, off, dynamic, file"),
        ("dynamic", "GZIP", "'GZIP'; expected one of: AUTO, NONE, SNAPPY"),
    ],
)
def test_unknown_names_list_the_choices(processing_mode, compression, message):
    import tensorflow as tf

    with pytest.raises(ValueError, match=message):
        distribute(tf.data.Dataset.range(3), "grpc://127.0.0.1:1", processing_mode, None, compression)


def test_a_service_needs_a_worker():
    with pytest.raises(ValueError, match="num_workers=0"):
        LocalDataService(num_workers=0)


if __name__ == "__main__":
    bring_up_loopback()
    print(RESULT_PREFIX + json.dumps(run_scenarios()), flush=True)


def test_a_dispatcher_that_does_not_answer_is_named_within_seconds():
    import time

    from bwopt.data.service import ServiceUnavailable, check_reachable, free_loopback_port

    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=r"pipeline.service.address='grpc://127.0.0.1:\d+': no tf.data"):
        check_reachable(f"grpc://127.0.0.1:{free_loopback_port()}", timeout_s=2)
    assert time.monotonic() - started < 5
