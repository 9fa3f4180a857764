"""An in-process tf.data service (one dispatcher, N workers) and distributing a dataset through it.

TensorFlow's tf.data service servers listen on every interface: TF 2.21 builds each gRPC server
with the hard-coded address "0.0.0.0:<port>" (tensorflow/core/data/service/server_lib.cc), and
neither DispatcherConfig nor WorkerConfig has a bind address; `worker_address` only sets the
address the worker advertises. The service has no authentication and its workers run whatever
dataset graph a client registers, so `LocalDataService` refuses to start while this process can
reach a non-loopback interface, unless told otherwise. In a private network namespace that has
only loopback (`unshare --user --map-root-user --net`, then bring `lo` up) it starts as is.
"""

import ipaddress
import socket
import time
from typing import Dict, List, Optional

# Keyed by bwopt.schema.SERVICE_PROCESSING_MODES: the ShardingPolicy each one means.
SHARDING_POLICIES: Dict[str, str] = {
    "parallel_epochs": "OFF",
    "distributed_epoch": "DYNAMIC",
    "off": "OFF",
    "dynamic": "DYNAMIC",
    "file": "FILE",
    "data": "DATA",
    "file_or_data": "FILE_OR_DATA",
    "hint": "HINT",
}
# Keyed by bwopt.schema.SERVICE_COMPRESSIONS: distribute()'s `compression` argument in TF 2.21,
# "AUTO" (snappy when the client and the worker are on different hosts), None (off) or "SNAPPY" (always).
ELEMENT_COMPRESSIONS: Dict[str, Optional[str]] = {"AUTO": "AUTO", "NONE": None, "SNAPPY": "SNAPPY"}
LOOPBACK_HOST = "127.0.0.1"


# How long a remote dispatcher may take to accept a connection before the run gives up.
CONNECT_TIMEOUT_S = 5.0


class ServiceUnavailable(RuntimeError):
    """The tf.data service cannot be used: a remote dispatcher does not answer, or a local one would
    be exposed beyond this host."""


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connect to a dispatcher's "grpc://host:port" once: TensorFlow itself would wait for it forever.

    Raises:
        ServiceUnavailable: naming the address and the key that sets it.
    """
    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as error:
        raise ServiceUnavailable(
            f"pipeline.service.address={address!r}: no tf.data dispatcher answered within {timeout_s:g} s ({error}); "
            "start it, or use pipeline.service.mode=local or off"
        ) from None


def check_loopback_only(allow_external_interfaces: bool) -> None:
    """Refuse to start a local service on a host that other machines can reach, unless allowed.

    Raises:
        ServiceUnavailable: naming the addresses and the key that allows it.
    """
    exposed = non_loopback_addresses()
    if exposed and not allow_external_interfaces:
        raise ServiceUnavailable(
            "tf.data service servers listen on 0.0.0.0 (TensorFlow offers no bind address), so "
            f"they would be reachable on {', '.join(exposed)}; run inside a network namespace "
            "that has only loopback, or accept the exposure with "
            "pipeline.service.allow_external_interfaces=true"
        )


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it; it may be taken later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK_HOST, 0))
        return probe.getsockname()[1]


def non_loopback_addresses() -> List[str]:
    """The IP addresses of this process's network namespace that are not loopback."""
    import psutil

    addresses = []
    for interface_addresses in psutil.net_if_addrs().values():
        for address in interface_addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                # IPv6 link-local addresses carry a zone ("fe80::1%eth0").
                if not ipaddress.ip_address(address.address.split("%")[0]).is_loopback:
                    addresses.append(address.address)
    return addresses


class LocalDataService:
    """A dispatcher and `num_workers` workers in this process, addressed over 127.0.0.1.

    Use as a context manager: entering starts the servers and waits until every worker has
    registered with the dispatcher; leaving stops the workers, then the dispatcher, which closes
    their ports. A stopped service cannot be started again.

    Attributes:
        address: what `distribute` takes as `service_address`: "<protocol>://127.0.0.1:<port>".
        dispatcher_port: the dispatcher's port.
        worker_addresses: "127.0.0.1:<port>" of each worker, as registered with the dispatcher.
    """

    def __init__(self, num_workers: int, protocol: str = "grpc", allow_external_interfaces: bool = False):
        """Pick the ports; nothing starts until the service is entered.

        Args:
            num_workers: workers to start (at least 1).
            protocol: the servers' protocol ("grpc", TensorFlow's only built-in one).
            allow_external_interfaces: start even though this process has non-loopback
                addresses, on which the servers will then be reachable (see the module docstring).
        """
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be at least 1")
        self.protocol = protocol
        self.allow_external_interfaces = allow_external_interfaces
        self.dispatcher_port = free_loopback_port()
        self.worker_addresses = [f"{LOOPBACK_HOST}:{free_loopback_port()}" for _ in range(num_workers)]
        self.address = f"{protocol}://{LOOPBACK_HOST}:{self.dispatcher_port}"
        self._dispatcher = None
        self._workers: list = []

    def __enter__(self) -> "LocalDataService":
        try:
            self.start()
        except BaseException:
            self.stop()  # whichever servers did start must not outlive the failure
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, registration_timeout_s: float = 30.0) -> None:
        """Start the dispatcher and the workers; return once all workers are registered.

        Raises:
            RuntimeError: if this process has non-loopback addresses and
                `allow_external_interfaces` is False, or if the workers do not all register
                within `registration_timeout_s`.
        """
        check_loopback_only(self.allow_external_interfaces)
        import tensorflow as tf

        service = tf.data.experimental.service
        # A fixed list of worker addresses lets the dispatcher use every sharding policy.
        self._dispatcher = service.DispatchServer(
            service.DispatcherConfig(
                port=self.dispatcher_port, protocol=self.protocol, worker_addresses=self.worker_addresses
            )
        )
        for worker_address in self.worker_addresses:
            config = service.WorkerConfig(
                dispatcher_address=f"{LOOPBACK_HOST}:{self.dispatcher_port}",
                worker_address=worker_address,
                port=int(worker_address.rsplit(":", 1)[1]),
                protocol=self.protocol,
            )
            self._workers.append(service.WorkerServer(config))
        self._wait_for_workers(registration_timeout_s)

    def _wait_for_workers(self, timeout_s: float) -> None:
        # _num_workers() is the dispatcher's own count; TensorFlow has no public equivalent.
        deadline = time.monotonic() + timeout_s
        while self._dispatcher._num_workers() < len(self.worker_addresses):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self._dispatcher._num_workers()} of {len(self.worker_addresses)} tf.data service "
                    f"workers registered within {timeout_s} s"
                )
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop the workers, then the dispatcher; their ports are closed on return. Idempotent."""
        for worker in self._workers:
            worker.stop()
        if self._dispatcher is not None:
            self._dispatcher.stop()


def distribute(dataset, service_address: str, processing_mode: str, job_name: Optional[str], compression: str):
    """`dataset` produced by the tf.data service at `service_address` instead of in this process.

    Args:
        dataset: any tf.data.Dataset; the service's workers run its graph.
        service_address: "<protocol>://<host>:<port>" of a dispatcher (`LocalDataService.address`).
        processing_mode: "parallel_epochs" (every worker produces the whole dataset: each
            element once per worker) or "distributed_epoch" (the workers share one pass: each
            element once), or a ShardingPolicy name: off, dynamic, file, data, file_or_data, hint.
        job_name: consumers that pass the same name share one job; None gives each its own.
        compression: "AUTO", "NONE" or "SNAPPY" (how elements travel from worker to client).

    Raises:
        ValueError: on an unknown processing mode or compression, listing the choices.
    """
    if processing_mode not in SHARDING_POLICIES:
        choices = ", ".join(SHARDING_POLICIES)
        raise ValueError(f"unknown processing_mode {processing_mode!r}; expected one of: {choices}")
    if compression not in ELEMENT_COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}; expected one of: {', '.join(ELEMENT_COMPRESSIONS)}")
    import tensorflow as tf

    service = tf.data.experimental.service
    return dataset.apply(
        service.distribute(
            processing_mode=service.ShardingPolicy[SHARDING_POLICIES[processing_mode]],
            service=service_address,
            job_name=job_name,
            compression=ELEMENT_COMPRESSIONS[compression],
        )
    )
