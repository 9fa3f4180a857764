"""What the figures mean together: efficiency against the ceilings, and what to try next."""

from dataclasses import dataclass
from typing import Dict, List, Optional

from bwopt.measure.timing import TimingFigures


@dataclass
class Ceilings:
    """Throughput ceilings measured apart from training (see `bwopt.measure.ceilings`); None = not measured.

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
    prefetch, map_parallelism, cache: str, transfer_dtype: str, num_parallel_reads=None, integer_features: bool = True
) -> List[str]:
    """The input-pipeline settings that leave speed on the table, in words.

    `prefetch` and `map_parallelism` are counts or 'autotune'; `num_parallel_reads` is None
    when the source is not read from files; `integer_features` says whether the stored
    features are integers, which uint8 carries without loss.
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
        off.append(
            "features cross as float32 (uint8 moves a quarter of the bytes)"
            if integer_features
            else "features cross as float32 (bfloat16 or float16 move half the bytes)"
        )
    return off


def recommend(
    figures: TimingFigures,
    *,
    prefetch,
    map_parallelism,
    cache: str,
    transfer_dtype: str,
    num_parallel_reads=None,
    integer_features: bool = True,
    on_cpu: bool = False,
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
        precision = "mixed_bfloat16" if on_cpu else "mixed_float16 / mixed_bfloat16"
        return f"{diagnosis}. Try strategy=mirrored, a larger train.global_batch_size, or device.precision={precision}"
    off = pipeline_knobs_off(prefetch, map_parallelism, cache, transfer_dtype, num_parallel_reads, integer_features)
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
