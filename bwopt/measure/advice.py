"""What the figures mean together: efficiency against the ceilings, and what to try next."""

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from bwopt.measure.ceilings import cores_ceiling, step_cores
from bwopt.measure.timing import TimingFigures
from bwopt.measure.verdicts import BOTH_BOUND


@dataclass
class Ceilings:
    """Throughput ceilings measured apart from training (see `bwopt.measure.ceilings`); None = not measured.

    Each ceiling is measured in several blocks (compute and input blocks alternating, so drift
    in the machine's speed falls on both); a ceiling is the median over its blocks, its spread
    the half range of the blocks relative to that median, `(max - min) / 2 / median`.

    Attributes:
        compute_examples_per_s: the train step alone, repeated on one batch already on the devices.
        input_examples_per_s: the distributed dataset alone, iterated without training.
        input_bytes_per_s: the same, in bytes as transferred (features plus labels).
        compute_spread, input_spread: relative half range over the blocks (0 with one block).
        compute_cpu_s_per_example, input_cpu_s_per_example: the process's CPU time per example
            over each side's timed blocks (median over the blocks; `bwopt.measure.ceilings.CpuClock`).
        cores: the cores this process may keep busy (`bwopt.measure.host.available_cores`); with both
            CPU costs, the cores ceiling.
    """

    compute_examples_per_s: Optional[float] = None
    input_examples_per_s: Optional[float] = None
    input_bytes_per_s: Optional[float] = None
    compute_spread: Optional[float] = None
    input_spread: Optional[float] = None
    compute_cpu_s_per_example: Optional[float] = None
    input_cpu_s_per_example: Optional[float] = None
    cores: Optional[float] = None

    @classmethod
    def from_blocks(
        cls,
        compute_blocks: Sequence[float],
        input_blocks: Sequence[float],
        input_bytes_blocks: Sequence[float],
        compute_cpu_blocks: Sequence[float] = (),
        input_cpu_blocks: Sequence[float] = (),
        cores: Optional[float] = None,
    ) -> "Ceilings":
        """Medians and spreads of per-block examples/s (and the input's bytes/s, and each side's
        CPU-seconds per example when measured)."""
        return cls(
            compute_examples_per_s=statistics.median(compute_blocks),
            input_examples_per_s=statistics.median(input_blocks),
            input_bytes_per_s=statistics.median(input_bytes_blocks),
            compute_spread=relative_spread(compute_blocks),
            input_spread=relative_spread(input_blocks),
            compute_cpu_s_per_example=statistics.median(compute_cpu_blocks) if compute_cpu_blocks else None,
            input_cpu_s_per_example=statistics.median(input_cpu_blocks) if input_cpu_blocks else None,
            cores=cores,
        )

    @property
    def cores_examples_per_s(self) -> Optional[float]:
        """The cores ceiling (`bwopt.measure.ceilings.cores_ceiling`); None unless both CPU costs were measured."""
        if None in (self.cores, self.compute_cpu_s_per_example, self.input_cpu_s_per_example):
            return None
        step_s = 1.0 / self.compute_examples_per_s if self.compute_examples_per_s else None
        return cores_ceiling(self.cores, self.compute_cpu_s_per_example, self.input_cpu_s_per_example, step_s)

    @property
    def step_cores(self) -> Optional[int]:
        """The whole cores the step holds while it runs (`bwopt.measure.ceilings.step_cores`)."""
        if None in (self.cores, self.compute_cpu_s_per_example) or not self.compute_examples_per_s:
            return None
        return step_cores(self.cores, self.compute_cpu_s_per_example, 1.0 / self.compute_examples_per_s)

    def metrics(self) -> Dict[str, float]:
        """The measured ceilings as MLflow metrics, e.g. `compute_ceiling_examples_per_s`."""
        named = {
            "compute_ceiling_examples_per_s": self.compute_examples_per_s,
            "input_ceiling_examples_per_s": self.input_examples_per_s,
            "input_ceiling_bytes_per_s": self.input_bytes_per_s,
            "compute_ceiling_spread": self.compute_spread,
            "input_ceiling_spread": self.input_spread,
            "compute_cpu_s_per_example": self.compute_cpu_s_per_example,
            "input_cpu_s_per_example": self.input_cpu_s_per_example,
            "cores_ceiling_examples_per_s": self.cores_examples_per_s,
            "step_cores": self.step_cores,
        }
        return {key: value for key, value in named.items() if value is not None}


def relative_spread(values: Sequence[float]) -> float:
    """Half the range of `values` relative to their median: (max - min) / 2 / median."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def efficiency_spread(efficiency_value: float, ceiling_metrics: Dict[str, float]) -> Optional[float]:
    """Efficiency x the relative spread of the lower ceiling; None when that spread was not measured.

    `ceiling_metrics` holds `Ceilings.metrics()` keys (other keys are ignored).
    """
    measured = [
        (ceiling_metrics[f"{name}_ceiling_examples_per_s"], name)
        for name in ("compute", "input")
        if f"{name}_ceiling_examples_per_s" in ceiling_metrics
    ]
    if not measured:
        return None
    spread = ceiling_metrics.get(f"{min(measured)[1]}_ceiling_spread")
    return None if spread is None else efficiency_value * spread


def efficiency(
    throughput_examples_per_s: float,
    compute_ceiling_examples_per_s: Optional[float],
    input_ceiling_examples_per_s: Optional[float],
) -> Optional[float]:
    """Training throughput / the lower of the measured ceilings; None when neither was measured.

    1.0 means training runs as fast as its slower part allows on its own; overlap lost between
    input and compute (no prefetch, host syncs) shows up as less. Above 1.0 is measurement noise
    (training cannot beat its own ceiling): show it only with `efficiency_spread`.
    """
    measured = [c for c in (compute_ceiling_examples_per_s, input_ceiling_examples_per_s) if c is not None]
    if not measured:
        return None
    return throughput_examples_per_s / min(measured)


@dataclass(frozen=True)
class PipelineKnobs:
    """The input pipeline's settings that the advice weighs.

    `prefetch` and `map_parallelism` are counts or 'autotune'; `num_parallel_reads` is None
    when the source is not read from files; `integer_features` says whether the stored
    features are integers, which uint8 carries without loss.
    """

    prefetch: object
    map_parallelism: object
    cache: str
    transfer_dtype: str
    num_parallel_reads: object = None
    integer_features: bool = True


def pipeline_knobs_off(knobs: PipelineKnobs) -> List[str]:
    """The input-pipeline settings that leave speed on the table, in words."""
    off = []
    if knobs.prefetch == 0:
        off.append("prefetch is 0")
    if knobs.map_parallelism == 1:
        off.append("map runs serially")
    if knobs.num_parallel_reads == 1:
        off.append("files are read one at a time")
    if knobs.cache == "off":
        off.append("nothing is cached")
    if knobs.transfer_dtype == "float32":
        off.append(
            "features cross as float32 (uint8 moves a quarter of the bytes)"
            if knobs.integer_features
            else "features cross as float32 (bfloat16 or float16 move half the bytes)"
        )
    return off


def recommend(
    figures: TimingFigures,
    knobs: PipelineKnobs,
    *,
    on_cpu: bool = False,
    compute_ceiling_examples_per_s: Optional[float] = None,
    input_ceiling_examples_per_s: Optional[float] = None,
    cores_ceiling_examples_per_s: Optional[float] = None,
    step_cores: Optional[int] = None,
) -> str:
    """One or two sentences on what limits the run and which knob to turn next.

    The verdict is `figures.verdict` (the input-wait verdict when the wait was not split).
    Input-bound runs name the pipeline settings that are off; host-overhead-bound runs get
    `train.steps_per_execution`; runs bound by both get both cures, the larger share's first;
    compute-bound runs get the compute-side knobs. The ceilings,
    when measured, are quoted next to the throughput. An input-bound run at 90 % or more of a cores
    ceiling below both others keeps every core busy: it is told to spend less CPU per example
    (with `step_cores`, the whole cores the step holds while it runs, said where it holds several).
    """
    verdict = figures.verdict or (
        "compute-bound" if figures.input_bound_verdict == "not input-bound" else figures.input_bound_verdict
    )
    rate = (
        f"{figures.throughput_examples_per_s:,.0f} examples/s"
        f"{_ceiling_numbers(compute_ceiling_examples_per_s, input_ceiling_examples_per_s)}"
    )
    if figures.input_stall_fraction is None:
        wait = f"{figures.input_wait_fraction * 100:.0f} % of step time waits for input"
    else:
        wait = (
            f"input stall {figures.input_stall_fraction * 100:.0f} %, host overhead "
            f"{figures.host_overhead_fraction * 100:.0f} % of step time"
        )
    diagnosis = f"{verdict}: {wait} at {rate}"
    rate_ceilings = [c for c in (compute_ceiling_examples_per_s, input_ceiling_examples_per_s) if c]
    if verdict.startswith("mixed"):
        diagnosis = f"{verdict} at {rate}"
        tries = [step for share, step in sorted(_cures(figures, knobs), reverse=True) if share >= 0.05]
        if not tries:
            return (
                f"{diagnosis}. Neither input nor host overhead stands out: time a longer window (measure.min_timed_s)"
            )
        return f"{diagnosis}. Try {', then '.join(tries)}"
    if verdict == BOTH_BOUND:
        tries = [step for _, step in sorted(_cures(figures, knobs), reverse=True)]
        return f"{diagnosis}. Each costs a fifth of the step or more: try {', then '.join(tries)}"
    if verdict == "host-overhead-bound":
        cure = _host_cure(figures)
        return f"{diagnosis}. The host's fixed cost per step (fetch a ready batch, dispatch, sync) dominates: {cure}"
    if verdict == "compute-bound":
        precision = "mixed_bfloat16" if on_cpu else "mixed_float16 / mixed_bfloat16"
        return f"{diagnosis}. Try strategy=mirrored, a larger train.global_batch_size, or device.precision={precision}"
    if cores_bound(figures.throughput_examples_per_s, cores_ceiling_examples_per_s, rate_ceilings):
        share = figures.throughput_examples_per_s / cores_ceiling_examples_per_s
        busy = "" if figures.cores_busy is None else f" ({figures.cores_busy:.2f} cores, measured over the timed steps)"
        step = "the step's and"
        if step_cores and step_cores > 1:
            held = f"the step holds {step_cores} while it runs"
            busy = f"{busy[:-1]}; {held})" if busy else f" ({held})"
            step = f"the step's {step_cores} cores for its time and"
        return (
            f"{diagnosis}. Every core is busy{busy}: training runs at {share:.0%} of the cores ceiling "
            f"({cores_ceiling_examples_per_s:,.0f} examples/s, {step} the pipeline's CPU time per "
            "example together), so more parallelism or prefetch cannot help: spend less CPU per example "
            "(pipeline.cache where the work is deterministic, pipeline.vectorized_map=true, cheaper maps) "
            "or add cores"
        )
    off = pipeline_knobs_off(knobs)
    if off:
        return f"{diagnosis}. {', '.join(off)}; try pipeline=tuned"
    return f"{diagnosis}. The pipeline knobs are on: make the host work per example cheaper, or send fewer bytes"


def cores_bound(throughput: float, cores_ceiling: Optional[float], other_ceilings: Sequence[float]) -> bool:
    """Whether the cores are the limit: their ceiling below every other one and training at 90 % of it or more."""
    if not cores_ceiling or not other_ceilings:
        return False
    return cores_ceiling < min(other_ceilings) and throughput >= 0.9 * cores_ceiling


def _host_setting(figures: TimingFigures) -> Tuple[str, str]:
    """(the host cure as a setting to try, why it helps)."""
    steps = figures.steps_per_execution
    if steps < 32:
        return f"train.steps_per_execution={max(8, 4 * steps)}", "fewer host round trips per step"
    return "a larger train.global_batch_size", "fewer steps for the same examples"


def _host_cure(figures: TimingFigures) -> str:
    setting, why = _host_setting(figures)
    verb = "set" if "=" in setting else "use"
    return f"{verb} {setting} ({why})"


def _cures(figures: TimingFigures, knobs: PipelineKnobs) -> List[tuple]:
    """(share of step time, what to try) for the input stall and the host overhead."""
    input_cure = "pipeline=tuned (input stall)" if pipeline_knobs_off(knobs) else "cheaper host work per example"
    return [
        (figures.input_stall_fraction or 0.0, input_cure),
        (figures.host_overhead_fraction or 0.0, f"{_host_setting(figures)[0]} (host overhead)"),
    ]


def _ceiling_numbers(compute_ceiling: Optional[float], input_ceiling: Optional[float]) -> str:
    parts = []
    if compute_ceiling is not None:
        parts.append(f"compute alone {compute_ceiling:,.0f}")
    if input_ceiling is not None:
        parts.append(f"input alone {input_ceiling:,.0f}")
    return f" ({', '.join(parts)} examples/s)" if parts else ""
