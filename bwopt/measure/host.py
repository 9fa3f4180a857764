"""Physical references measured in the run's own process: memcpy bandwidth, peak memory, and the
cores it may use."""

import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np


def available_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float:
    """The cores this process may keep busy: its CPU affinity, capped by a cgroup CPU quota (a
    container's `--cpus`, a Kubernetes CPU limit), which affinity does not show. cgroup v2 reads
    `cpu.max` ("QUOTA PERIOD" or "max PERIOD"), v1 `cpu/cpu.cfs_quota_us` and `cpu.cfs_period_us`
    (-1: no quota). A quota of 1.5 cores gives 1.5."""
    cores = float(len(os.sched_getaffinity(0)))
    for quota_file, period_file in (
        (cgroup_root / "cpu.max", None),
        (cgroup_root / "cpu" / "cpu.cfs_quota_us", cgroup_root / "cpu" / "cpu.cfs_period_us"),
    ):
        try:
            fields = quota_file.read_text().split()
            if period_file is not None:
                fields += period_file.read_text().split()
            quota, period = float(fields[0]), float(fields[1])
        except (OSError, ValueError, IndexError):  # absent, "max" (no quota), or unreadable
            continue
        if quota > 0 and period > 0:
            return min(cores, quota / period)
    return cores


def host_memcpy_bandwidth_bytes_per_s(num_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Host memory-copy bandwidth: a ceiling for any host-side step that moves every byte once.

    Timed: `np.copyto` of one preallocated uint8 buffer of `num_bytes` into another, `repeats`
    times; the fastest copy counts. Excluded: allocating and first-touching both buffers (one
    untimed copy faults their pages in). The figure counts each byte once (`num_bytes` / s),
    not read + write, so it compares directly with a pipeline's bytes/s.

    The two buffers add 2 x `num_bytes` to the process's resident set: read
    `peak_host_rss_bytes` before calling this, or the peak reports the buffers.
    """
    source = np.ones(num_bytes, dtype=np.uint8)
    destination = np.empty_like(source)
    np.copyto(destination, source)
    fastest_s = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(destination, source)
        fastest_s = min(fastest_s, time.perf_counter() - started)
    return num_bytes / fastest_s


PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_host_rss() -> bool:
    """Start a new peak-RSS window (Linux: writing 5 to /proc/self/clear_refs resets VmHWM).

    Several runs share one process in a Hydra multirun; without this, each would report the
    peak of the runs before it. Returns False where the kernel offers no reset.
    """
    try:
        PROC_CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_host_rss_bytes() -> int:
    """Peak resident set size of this process, in bytes, since `reset_peak_host_rss` or start-up.

    Linux: VmHWM of /proc/self/status (which the reset lowers); elsewhere `getrusage` ru_maxrss
    (kilobytes on Linux, bytes on macOS), which never goes down.
    """
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_device_memory_peaks(device_names: List[str]) -> None:
    """Start a new peak window on each GPU or TPU among `device_names` (CPU devices keep no stats)."""
    import tensorflow as tf

    for name in device_names:
        if tf.DeviceSpec.from_string(name).device_type in ("GPU", "TPU"):
            tf.config.experimental.reset_memory_stats(name)


def peak_device_memory_bytes(device_names: List[str]) -> Optional[Dict[str, int]]:
    """Peak memory TensorFlow's allocator held on each GPU or TPU, in bytes, keyed by device name.

    The peak counts since the process started or since `reset_device_memory_peaks`; it is memory
    in use by tensors, not what the allocator reserved (memory growth changes the latter). CPU
    devices are skipped: TensorFlow keeps no memory statistics for them. Returns None when no
    GPU or TPU is among `device_names`.
    """
    import tensorflow as tf

    accelerators = [name for name in device_names if tf.DeviceSpec.from_string(name).device_type in ("GPU", "TPU")]
    if not accelerators:
        return None
    return {name: int(tf.config.experimental.get_memory_info(name)["peak"]) for name in accelerators}
