"""Every figure bwopt reports, defined once.

A training step is timed in two parts on the host's monotonic clock (`time.perf_counter`):

- input wait: the time blocked in `next(iterator)` on the distributed dataset, i.e. until the
  batch for every replica is available;
- compute: from dispatching the step to the moment its results are back on the host (the loop
  reads them, so the step has finished on every replica).

Step time is their sum. Steps run back to back, so the sum of the step times of the timed steps
is the wall time they took. The first `warmup_steps` steps (tracing, autotuning, cache fill) are
excluded from every figure; validation between epochs is not part of any step.
"""

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

# TensorFlow Profiler's input-pipeline analyzer thresholds on the input-wait fraction.
MODERATELY_INPUT_BOUND = 0.05
HIGHLY_INPUT_BOUND = 0.20

# Scales the median absolute deviation to the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826


@dataclass
class StepTimer:
    """Per-step input-wait and compute times, in seconds, in step order."""

    input_wait_s: List[float] = field(default_factory=list)
    compute_s: List[float] = field(default_factory=list)

    def record(self, input_wait_s: float, compute_s: float) -> None:
        self.input_wait_s.append(input_wait_s)
        self.compute_s.append(compute_s)

    @property
    def num_steps(self) -> int:
        return len(self.compute_s)


@dataclass
class TimingFigures:
    """Figures over the timed (post warm-up) steps.

    Attributes:
        num_timed_steps: steps measured, warm-up excluded.
        timed_wall_s: wall time of the timed steps (sum of their step times).
        throughput_examples_per_s: examples consumed by the timed steps / timed_wall_s.
        throughput_bytes_per_s: host bytes of those examples (features as transferred, plus
            labels) / timed_wall_s.
        step_time_p50_s, step_time_p90_s, step_time_p99_s: percentiles of the step time
            (linear interpolation between order statistics).
        step_time_jitter_s: 1.4826 x the median absolute deviation of the step time, a spread
            that a few outliers (a GC pause, an epoch boundary) do not inflate.
        input_wait_fraction: total input wait / timed_wall_s.
        input_bound_verdict: the TF Profiler's reading of input_wait_fraction.
    """

    num_timed_steps: int
    timed_wall_s: float
    throughput_examples_per_s: float
    throughput_bytes_per_s: float
    step_time_p50_s: float
    step_time_p90_s: float
    step_time_p99_s: float
    step_time_jitter_s: float
    input_wait_fraction: float
    input_bound_verdict: str

    def metrics(self) -> dict:
        """The numeric figures, as MLflow metrics."""
        return {key: value for key, value in asdict(self).items() if not isinstance(value, str)}


def input_bound_verdict(input_wait_fraction: float) -> str:
    """'not input-bound' below 5 %, 'moderately input-bound' below 20 %, else 'highly input-bound'."""
    if input_wait_fraction < MODERATELY_INPUT_BOUND:
        return "not input-bound"
    if input_wait_fraction < HIGHLY_INPUT_BOUND:
        return "moderately input-bound"
    return "highly input-bound"


def jitter(values: Sequence[float]) -> float:
    values = np.asarray(values, dtype=np.float64)
    return float(MAD_TO_SIGMA * np.median(np.abs(values - np.median(values))))


def timing_figures(
    timer: StepTimer,
    warmup_steps: int,
    examples_per_step: int,
    bytes_per_step: int,
    excluded: Sequence[int] = (),
) -> TimingFigures:
    """Summarise the steps after the first `warmup_steps`, less the `excluded` ones.

    `excluded` holds step indices left out like warm-up, e.g. the steps a profiler traced.

    Raises:
        ValueError: when no step is left after the warm-up.
    """
    skipped = set(excluded)
    kept = [index for index in range(warmup_steps, timer.num_steps) if index not in skipped]
    input_wait = np.asarray(timer.input_wait_s, dtype=np.float64)[kept]
    step = input_wait + np.asarray(timer.compute_s, dtype=np.float64)[kept]
    if len(step) == 0:
        raise ValueError(f"no step was timed: {timer.num_steps} steps ran, {warmup_steps} are warm-up")
    wall_s = float(step.sum())
    fraction = float(input_wait.sum() / wall_s)
    p50, p90, p99 = np.percentile(step, [50, 90, 99])
    return TimingFigures(
        num_timed_steps=len(step),
        timed_wall_s=wall_s,
        throughput_examples_per_s=len(step) * examples_per_step / wall_s,
        throughput_bytes_per_s=len(step) * bytes_per_step / wall_s,
        step_time_p50_s=float(p50),
        step_time_p90_s=float(p90),
        step_time_p99_s=float(p99),
        step_time_jitter_s=jitter(step),
        input_wait_fraction=fraction,
        input_bound_verdict=input_bound_verdict(fraction),
    )


# ---- Host and device memory -------------------------------------------------------------------


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


def peak_host_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (`getrusage` ru_maxrss).

    Linux reports ru_maxrss in kilobytes, macOS in bytes. The peak never goes down, so it covers
    everything the process did before the call, start-up and imports included.
    """
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_device_memory_bytes(device_names: List[str]) -> Optional[Dict[str, int]]:
    """Peak memory TensorFlow's allocator held on each GPU or TPU, in bytes, keyed by device name.

    The peak counts since the process started or since the last
    `tf.config.experimental.reset_memory_stats`. CPU devices are skipped: TensorFlow keeps no
    memory statistics for them. Returns None when no GPU or TPU is among `device_names`.
    """
    import tensorflow as tf

    accelerators = [
        name for name in device_names if tf.DeviceSpec.from_string(name).device_type in ("GPU", "TPU")
    ]
    if not accelerators:
        return None
    return {name: int(tf.config.experimental.get_memory_info(name)["peak"]) for name in accelerators}


# ---- Ceilings, efficiency and a recommendation ------------------------------------------------


@dataclass
class Ceilings:
    """Throughput ceilings measured apart from training (see `bwopt.ceilings`); None = not measured.

    Attributes:
        compute_examples_per_s: the train step alone, repeated on one batch already on the devices.
        input_examples_per_s: the distributed dataset alone, iterated without training.
        input_bytes_per_s: the same, in bytes as transferred (features plus labels).
    """

    compute_examples_per_s: Optional[float] = None
    input_examples_per_s: Optional[float] = None
    input_bytes_per_s: Optional[float] = None

    def metrics(self) -> Dict[str, float]:
        """The measured ceilings as MLflow metrics, e.g. `compute_ceiling_examples_per_s`."""
        named = {
            "compute_ceiling_examples_per_s": self.compute_examples_per_s,
            "input_ceiling_examples_per_s": self.input_examples_per_s,
            "input_ceiling_bytes_per_s": self.input_bytes_per_s,
        }
        return {key: value for key, value in named.items() if value is not None}


def efficiency(
    throughput_examples_per_s: float,
    compute_ceiling_examples_per_s: Optional[float],
    input_ceiling_examples_per_s: Optional[float],
) -> Optional[float]:
    """Training throughput / the lower of the measured ceilings; None when neither was measured.

    1.0 means training runs as fast as its slower part allows on its own; overlap lost between
    input and compute (no prefetch, host syncs) shows up as less.
    """
    measured = [c for c in (compute_ceiling_examples_per_s, input_ceiling_examples_per_s) if c is not None]
    if not measured:
        return None
    return throughput_examples_per_s / min(measured)


def pipeline_knobs_off(
    prefetch, map_parallelism, cache: str, transfer_dtype: str, num_parallel_reads=None
) -> List[str]:
    """The input-pipeline settings that leave speed on the table, in words.

    `prefetch` and `map_parallelism` are counts or 'autotune'; `num_parallel_reads` is None
    when the source is not read from files.
    """
    off = []
    if prefetch == 0:
        off.append("prefetch is 0")
    if map_parallelism == 1:
        off.append("map runs serially")
    if num_parallel_reads == 1:
        off.append("files are read one at a time")
    if cache == "off":
        off.append("nothing is cached")
    if transfer_dtype == "float32":
        off.append("features cross as float32 (uint8 moves a quarter of the bytes)")
    return off


def recommend(
    figures: TimingFigures,
    *,
    prefetch,
    map_parallelism,
    cache: str,
    transfer_dtype: str,
    num_parallel_reads=None,
    compute_ceiling_examples_per_s: Optional[float] = None,
    input_ceiling_examples_per_s: Optional[float] = None,
) -> str:
    """One or two sentences on what limits the run and which knob to turn next.

    Input-bound runs (verdict moderately or highly) name the pipeline settings that are off;
    other runs are compute-bound and get the compute-side knobs. The ceilings, when measured,
    are quoted next to the throughput.
    """
    verdict = "compute-bound" if figures.input_bound_verdict == "not input-bound" else figures.input_bound_verdict
    diagnosis = (
        f"{verdict}: {figures.input_wait_fraction * 100:.0f} % of step time waits for input at "
        f"{figures.throughput_examples_per_s:,.0f} examples/s"
        f"{_ceiling_numbers(compute_ceiling_examples_per_s, input_ceiling_examples_per_s)}"
    )
    if verdict == "compute-bound":
        return (
            f"{diagnosis}. Try strategy=mirrored, a larger train.global_batch_size, or "
            f"device.precision=mixed_float16 / mixed_bfloat16"
        )
    off = pipeline_knobs_off(prefetch, map_parallelism, cache, transfer_dtype, num_parallel_reads)
    if off:
        return f"{diagnosis}. {', '.join(off)}; try pipeline=tuned"
    return f"{diagnosis}. The pipeline knobs are on: make the host work per example cheaper, or send fewer bytes"


def _ceiling_numbers(compute_ceiling: Optional[float], input_ceiling: Optional[float]) -> str:
    parts = []
    if compute_ceiling is not None:
        parts.append(f"compute alone {compute_ceiling:,.0f}")
    if input_ceiling is not None:
        parts.append(f"input alone {input_ceiling:,.0f}")
    return f" ({', '.join(parts)} examples/s)" if parts else ""
