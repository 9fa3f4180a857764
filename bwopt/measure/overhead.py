"""The per-call costs that split the input wait: fetching a ready batch, dispatching a step.

Both are measured in the run's own process, after training, on the run's own strategy and
batch structure (see `bwopt.measure.timing` for how they split the input wait). Each is the
median over `num_blocks` blocks of the mean per-call time of `calls_per_block` back-to-back
calls, on the host's monotonic clock; the first block is a warm-up and left out (tracing,
the first copies). Each returns (median, lowest block, highest block): the blocks' range holds
their median's true value about 94 % of the time (1 - 2 x 0.5^5 for five blocks), and the
partition's intervals take it in (bwopt.measure.timing).
"""

import statistics
import time
from typing import Callable, Iterator, List, Tuple

from bwopt.measure.ceilings import read_on_host


def per_call_s(call: Callable[[], object], calls_per_block: int, num_blocks: int) -> List[float]:
    """Mean seconds per call of `call()` in each of `num_blocks` timed blocks (after one untimed block)."""
    for _ in range(calls_per_block):
        call()
    blocks = []
    for _ in range(num_blocks):
        started = time.perf_counter()
        for _ in range(calls_per_block):
            call()
        blocks.append((time.perf_counter() - started) / calls_per_block)
    return blocks


def median_and_range(blocks: List[float]) -> Tuple[float, float, float]:
    return statistics.median(blocks), min(blocks), max(blocks)


def fetch_overhead_s(
    ready_iterator: Iterator, calls_per_block: int = 30, num_blocks: int = 5
) -> Tuple[float, float, float]:
    """Seconds one `next()` costs when its batch is ready: the fixed cost of fetching a batch.

    Timed: `next(ready_iterator)`, exactly what the timed loop times as input wait, where
    `ready_iterator` is the same kind of distributed iterator as training's (same strategy, same
    input options), over one cached batch repeated forever, so no call waits for pipeline work.
    """
    return median_and_range(per_call_s(lambda: next(ready_iterator), calls_per_block, num_blocks))


def dispatch_overhead_s(
    empty_step: Callable, batch, calls_per_block: int = 30, num_blocks: int = 5, read: bool = True
) -> Tuple[float, float, float]:
    """Seconds one step that computes nothing costs: dispatch of the distributed call, and the host
    read of its results where the timed loop reads each step's (`read`; bwopt.train.loop_step).

    Timed: `read_on_host(empty_step(batch))` (or the call alone), with `empty_step` a compiled
    distributed step with the train step's signature that only returns per-replica zeros, reduced
    over replicas.
    """
    call = (lambda: read_on_host(empty_step(batch))) if read else (lambda: empty_step(batch))
    return median_and_range(per_call_s(call, calls_per_block, num_blocks))


def ready_execution_s(
    execution: Callable, ready_iterator, calls_per_block: int = 2, num_blocks: int = 5, read: bool = True
) -> Tuple[float, float, float]:
    """Seconds one N-step execution costs on batches always ready (`train.steps_per_execution` > 1).

    Timed: `read_on_host(execution(ready_iterator))` (the call alone where `read` is false, as the
    timed loop times it) with `ready_iterator` over one cached batch; it trains, so measure after
    the run's figures are taken.
    """
    call = (lambda: read_on_host(execution(ready_iterator))) if read else (lambda: execution(ready_iterator))
    return median_and_range(per_call_s(call, calls_per_block, num_blocks))
