"""Figures of steps that overlap: parameter-server closures, run asynchronously on several workers.

Their throughput is not examples / the sum of step times but examples / the wall time the timed
closures spanned: in each epoch, from the earliest start to the latest end among its timed
closures (on one host exact; across hosts it assumes synchronised clocks, e.g. NTP), summed over
epochs. `async_timed_wall_s` carries it and `overlapping_steps_figures` applies it;
`closure_throughput_examples_per_s` keeps the per-closure rate (examples / summed step time), and
`worker_busy_fraction` = summed step time / (span x workers). bwopt.coordinated measures the closures.
"""

from dataclasses import replace
from typing import Dict, List

import numpy as np

# The measurement that carries the wall time the timed closures spanned together.
ASYNC_WALL_KEY = "async_timed_wall_s"


def asynchronous_figures(closures: List[tuple], plan, examples_per_step: int) -> Dict[str, float]:
    """The span of the timed closures (their wall time together) and the per-worker figures.

    `closures`: (step number, started, fetched, finished, worker index) per closure, worker clock.
    """
    timed = set(plan.timed(len(closures)))
    kept = [closure for closure in closures if closure[0] in timed]
    if not kept:
        return {}
    span = 0.0
    for epoch in range(plan.epochs):
        in_epoch = [c for c in kept if epoch * plan.steps_per_epoch <= c[0] < (epoch + 1) * plan.steps_per_epoch]
        if in_epoch:
            span += max(c[3] for c in in_epoch) - min(c[1] for c in in_epoch)
    step_s = sum(c[3] - c[1] for c in kept)
    num_workers = len({c[4] for c in kept})
    figures = {
        ASYNC_WALL_KEY: span,
        "closure_throughput_examples_per_s": len(kept) * examples_per_step / step_s,
        # Time the workers spent inside closures over what they had; the rest is the coordinator's
        # dispatch and the RPCs between closures.
        "worker_busy_fraction": step_s / (span * num_workers),
    }
    for worker in sorted({c[4] for c in kept}):
        mine = [c for c in kept if c[4] == worker]
        wait = sum(c[2] - c[1] for c in mine)
        total = sum(c[3] - c[1] for c in mine)
        figures[f"worker{worker}/num_timed_steps"] = len(mine)
        figures[f"worker{worker}/throughput_examples_per_s"] = len(mine) * examples_per_step / span
        figures[f"worker{worker}/input_wait_fraction"] = wait / total
        figures[f"worker{worker}/step_time_p50_s"] = float(np.median([c[3] - c[1] for c in mine]))
    return figures


def overlapping_steps_figures(figures, measurements: Dict[str, float]):
    """TimingFigures of overlapping (asynchronous) steps: throughput over the wall time they spanned.

    Step-time percentiles, jitter and the input-wait fraction stay per step; `timed_wall_s` and
    the throughputs use `measurements[ASYNC_WALL_KEY]` (see the module docstring). Unchanged
    when the mode measured no span (synchronous steps run back to back).
    """
    wall_s = measurements.get(ASYNC_WALL_KEY)
    if figures is None or not wall_s:
        return figures
    scale = figures.timed_wall_s / wall_s
    interval = figures.throughput_examples_per_s_ci95
    return replace(
        figures,
        timed_wall_s=wall_s,
        throughput_examples_per_s=figures.throughput_examples_per_s * scale,
        throughput_bytes_per_s=figures.throughput_bytes_per_s * scale,
        # on the figure's scale: the blocks' spread of the steps' rate, carried to the span's
        throughput_examples_per_s_ci95=[bound * scale for bound in interval] if interval else interval,
    )
