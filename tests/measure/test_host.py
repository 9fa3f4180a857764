"""Host memcpy bandwidth and peak memory, each checked against a measurement made another way."""

import sys
import time

import numpy as np
import psutil
import pytest

from bwopt.measure import (
    host_memcpy_bandwidth_bytes_per_s,
    peak_device_memory_bytes,
    peak_host_rss_bytes,
    reset_peak_host_rss,
)

MiB = 2**20


def memoryview_copy_bytes_per_s(num_bytes: int, repeats: int) -> float:
    """Best-of-`repeats` copy between two bytearrays through memoryview slice assignment."""
    source, destination = bytearray(b"\x01" * num_bytes), bytearray(num_bytes)
    source_view, destination_view = memoryview(source), memoryview(destination)
    destination_view[:] = source_view  # fault the pages in, untimed
    fastest_s = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        destination_view[:] = source_view
        fastest_s = min(fastest_s, time.perf_counter() - started)
    return num_bytes / fastest_s


def test_memcpy_bandwidth_agrees_with_a_memoryview_copy():
    # Alternated, the best of each: a burst of other work (a test beside this one reads 4.2 against
    # 13.4 GB/s at a single try each) then slows both sides' slower tries, not their best.
    numpy_bytes_per_s = memoryview_bytes_per_s = 0.0
    for _ in range(4):
        numpy_bytes_per_s = max(numpy_bytes_per_s, host_memcpy_bandwidth_bytes_per_s(32 * MiB, repeats=5))
        memoryview_bytes_per_s = max(memoryview_bytes_per_s, memoryview_copy_bytes_per_s(32 * MiB, repeats=5))
    # Both end in the C library's memcpy; a factor of 3 leaves room for a noisy neighbour.
    assert 1 / 3 <= numpy_bytes_per_s / memoryview_bytes_per_s <= 3
    assert numpy_bytes_per_s > 100e6


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_rss_grows_with_a_touched_allocation_and_resets_per_run():
    import resource

    process = psutil.Process()
    rss_before = process.memory_info().rss
    array = np.ones(256 * MiB, dtype=np.uint8)  # np.ones writes, so every page is resident
    rss_with_array = process.memory_info().rss
    assert rss_with_array >= rss_before + 240 * MiB
    peak = peak_host_rss_bytes()
    # The kernel folds per-thread RSS counters into the peak lazily, a few pages behind.
    assert peak >= rss_with_array - 4 * MiB
    # getrusage's lifetime peak, read another way, is at least as high.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 >= peak - 4 * MiB
    del array
    assert reset_peak_host_rss()
    # A new window starts at the current RSS, well below the freed array's peak.
    assert peak_host_rss_bytes() == pytest.approx(process.memory_info().rss, abs=16 * MiB)
    assert peak_host_rss_bytes() < peak - 200 * MiB


def test_peak_device_memory_is_none_without_an_accelerator(devices):
    assert peak_device_memory_bytes(devices.device_names) is None


@pytest.mark.gpu
def test_peak_device_memory_grows_by_a_known_allocation(devices):
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU: tf.config.list_physical_devices('GPU') is empty")
    gpu = tf.config.list_logical_devices("GPU")[0].name
    tf.config.experimental.reset_memory_stats(gpu)
    before = tf.config.experimental.get_memory_info(gpu)["current"]
    with tf.device(gpu):
        tensor = tf.ones((64 * MiB,), tf.uint8)
    peaks = peak_device_memory_bytes(["/device:CPU:0", gpu])
    assert set(peaks) == {gpu}  # CPU devices are skipped
    assert peaks[gpu] >= before + tensor.shape[0]


@pytest.mark.gpu
def test_the_copy_to_a_gpu_runs_at_a_bus_bandwidth_whatever_its_size(devices):
    """tune's probe times a batch's copy to the GPU (pipeline.distribute.fetch_to_device): a bus's
    bandwidth (PCIe to NVLink-C2C), the same for 16 and 64 MiB within a factor of two."""
    import tensorflow as tf

    from bwopt.sweep.tune_probe import device_copy_bandwidth_bytes_per_s

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU: tf.config.list_physical_devices('GPU') is empty")
    gpu = tf.config.list_logical_devices("GPU")[0].name
    large = device_copy_bandwidth_bytes_per_s(gpu, 64 * MiB)
    small = device_copy_bandwidth_bytes_per_s(gpu, 16 * MiB)
    assert 1e9 < large < 1e12
    assert 0.5 < small / large < 2


@pytest.mark.parametrize(
    "files, expected",
    [
        ({}, None),  # no cgroup files: the affinity
        ({"cpu.max": "max 100000\n"}, None),  # v2 without a quota
        ({"cpu.max": "150000 100000\n"}, 1.5),  # v2: a container limited to 1.5 CPUs
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1 without a quota
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),  # v1 quota
        ({"cpu.max": "6400000 100000\n"}, None),  # a quota above the affinity: the affinity
    ],
)
def test_available_cores_is_the_affinity_capped_by_a_cgroup_quota(tmp_path, files, expected):
    import os

    from bwopt.measure.host import available_cores

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path) == pytest.approx(min(expected or affinity, affinity))
