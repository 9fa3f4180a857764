"""The run's bottleneck in words, from the shares of step time its timed loop measured.

A share's thresholds are TensorFlow Profiler's for the input wait (5 %, 20 %) and bwopt's for host
overhead (20 %: fusing steps could then gain 1.25x or more). `interval_verdict` names a level only
where a share's whole interval lies in it.
"""

from typing import Optional, Sequence, Tuple

from bwopt.measure.uncertainty import percent_range

# TensorFlow Profiler's input-pipeline analyzer thresholds on the input-wait fraction.
MODERATELY_INPUT_BOUND = 0.05
HIGHLY_INPUT_BOUND = 0.20

# Host overhead (fetch of a ready batch, dispatch, host sync) at or above this share of step time
# names the run host-overhead-bound: fusing N steps per call could then gain >= 1.25x.
HOST_OVERHEAD_BOUND = 0.20


def input_bound_verdict(input_wait_fraction: float) -> str:
    """'not input-bound' below 5 %, 'moderately input-bound' below 20 %, else 'highly input-bound'."""
    if input_wait_fraction < MODERATELY_INPUT_BOUND:
        return "not input-bound"
    if input_wait_fraction < HIGHLY_INPUT_BOUND:
        return "moderately input-bound"
    return "highly input-bound"


# Both the input stall and host overhead at or above their 20 % thresholds: each cure pays on its own,
# and which share is the larger changes from run to run on the same machine, so both are named.
BOTH_BOUND = "input- and host-overhead-bound"


def bottleneck_verdict(input_stall_fraction: float, host_overhead_fraction: float) -> str:
    """The run's bottleneck: a stall of >= 20 % of step time "highly input-bound", host overhead
    >= 20 % "host-overhead-bound", both `BOTH_BOUND`; else a stall of >= 5 % is "moderately
    input-bound"; else "compute-bound" (the device's own work, or the step's math on the CPU)."""
    input_verdict = input_bound_verdict(input_stall_fraction)
    if host_overhead_fraction >= HOST_OVERHEAD_BOUND:
        return BOTH_BOUND if input_verdict == "highly input-bound" else "host-overhead-bound"
    return "compute-bound" if input_verdict == "not input-bound" else input_verdict


def level(bounds: Sequence[float], thresholds: Sequence[Tuple[float, str]], below: str) -> Optional[str]:
    """The name of the band both ends of `bounds` fall in (`thresholds`: ascending (value, name)
    pairs, `below` under the first); None when the interval straddles a threshold."""

    def band(value: float) -> str:
        return next((name for threshold, name in reversed(thresholds) if value >= threshold), below)

    low, high = band(bounds[0]), band(bounds[1])
    return low if low == high else None


INPUT_LEVELS = ((MODERATELY_INPUT_BOUND, "moderately input-bound"), (HIGHLY_INPUT_BOUND, "highly input-bound"))


def interval_verdict(stall_ci: Sequence[float], host_ci: Optional[Sequence[float]]) -> str:
    """`bottleneck_verdict` where the intervals clear its thresholds; otherwise "mixed: ..." with what is known.

    `stall_ci`: the input stall's share (the whole input wait's when it was not split);
    `host_ci`: host overhead's share (None: not split).
    """
    input_level = level(stall_ci, INPUT_LEVELS, "not input-bound")
    known = f"input stall {percent_range(stall_ci)}"
    if host_ci is None:  # the wait was not split: no host overhead to weigh
        if input_level == "not input-bound":
            return "compute-bound"
        return input_level or f"mixed: {known}, at a threshold of input-bound (5 %, 20 %)"
    host_bound = level(host_ci, ((HOST_OVERHEAD_BOUND, True),), False)
    known += f", host overhead {percent_range(host_ci)}"
    if host_bound is True:
        if input_level == "highly input-bound":
            return BOTH_BOUND
        return "host-overhead-bound" if stall_ci[1] < HIGHLY_INPUT_BOUND else f"mixed: {known}"
    if host_bound is False:
        if input_level == "not input-bound":
            return "compute-bound"
        return input_level or f"mixed: {known}"
    return f"mixed: {known}"  # host overhead straddles 20 %
