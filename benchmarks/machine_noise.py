"""Where run-to-run noise comes from: an input pipeline's rate window by window, on TensorFlow's
shared thread pool and on a private one, against the machine's memory bandwidth and compute speed.

A tuning compares fresh processes whose throughput scatters by 10-25 % on this machine. This script
asks whether that scatter belongs to the machine or to the pipeline's process. One process builds
bwopt's training pipeline of `experiment=pipelines pipeline=naive pipeline.vectorized_map=true`
(`mode=input`'s distributed dataset) three times, differing only in the thread pool its functions
run on (`pipeline.options.private_threadpool_size`: 0, TensorFlow's shared inter-op pool; the
cores; 1), and takes turns, round after round, between

- a window of each pipeline, in a new seeded order each round, each after a pause of 1 s, not
  measured, in which the pipeline before it goes idle (measured inside the next window, a
  pipeline's leftover work slowed a matrix product from 2,600 to 62 per second): examples/s and
  the process's CPU milliseconds per example;
- after another pause, `memcpy`: one 64 MiB NumPy array copied into another, GB/s (the host's
  memory bandwidth, as bwopt's `host memcpy` line measures it), and `compute`: a 256x256 float64
  matrix product, products/s (arithmetic in the cache).

Printed per pipeline: the median rate, its window-to-window spread (standard deviation over the
mean), the windows slower than 0.6 of its median ("slow episodes"), the median and largest CPU
per example, the cores it kept busy (rate x CPU per example); the ratio of each private pool to
the shared one per round (`_common.spread`: geometric mean, 95 % interval, median, min-max); and
the correlation of the shared pool's rate with each reference over the rounds, with its 95 %
interval (Fisher's z), of the levels and of the changes from one round to the next (levels that
drift together over minutes correlate without moving together round by round; the interval takes
the rounds as independent). A correlation above 0 says the pipeline slows when the reference
does; slow episodes on the pools that spread work over the cores, and none on one thread, say the
work split over the cores waits for the slower one.

Measured here (2026-12-05, 40 rounds, idle cores), with the pause before every window: on two
threads (the shared pool, or a private pool of 2: 1.58-1.59 cores busy) the pipeline's windows
scattered by 22.8 %, 5 of 40 under 0.6 of the median (CPU per example up to 2.5x its median); on a
private pool of 1 (1.00 core busy) by 5.9 % and none, at 0.706 of the rate (95 % CI 0.646-0.771).
A private pool of 2 / the shared pool: 0.987 (0.925-1.053), no difference detected. The
references scattered too (memcpy 16.8 %, matrix product 16.1 %) but not with the pipeline: r =
0.08 and -0.01 for the levels, 0.22 and -0.29 for the round-to-round changes, every interval
holding 0. Two earlier runs, without the pause before each pipeline window, read alike (spreads
19-26 % on two threads, 4-6 % on one; one correlation, r = 0.53 with the matrix product, that this
run does not repeat). So the slow episodes are the pipeline's own when its work is spread over
both cores, not the machine's memory or arithmetic slowing down.

Run: `.venv/bin/python benchmarks/machine_noise.py [--rounds N] [--window S]` (40 rounds of 1.5 s
pipeline windows, about 8 min); `BWOPT_BENCHMARK_SMOKE=1` runs three short rounds (the smoke test).
"""

import argparse
import math
import os
import random
import statistics
import time
from typing import Callable, Dict, List, Sequence, Tuple

from _common import QUIET, SMOKE, compose, configure_devices, load_line, spread

ROUNDS = 3 if SMOKE else 40
WINDOW_S = 0.2 if SMOKE else 1.5
SETTLE_S = 0.05 if SMOKE else 1.0
SLOW = 0.6  # a window below this share of its pipeline's median rate is a slow episode
WORKLOAD = [
    *QUIET,
    "experiment=pipelines",
    "pipeline=naive",
    "pipeline.vectorized_map=true",
    "mode=input",
    "tracking=none",
    "train.epochs=1000",
]
COPY_BYTES = 64 * 2**20


def window(call: Callable[[], object], seconds: float) -> Tuple[float, float]:
    """(calls per second, process CPU seconds per call) of `call` repeated for `seconds`."""
    calls, started, cpu_started = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        call()
        calls += 1
    return calls / (time.perf_counter() - started), (time.process_time() - cpu_started) / calls


def correlation(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float, float]:
    """Pearson's r of the windows and its 95 % interval by Fisher's z (-1 to 1 below 4 windows; the
    rounds are taken as independent, which windows close in time may not be: see `differences`)."""
    r = statistics.correlation(xs, ys)
    if abs(r) >= 1:
        return r, r, r
    if len(xs) < 4:
        return r, -1.0, 1.0
    z, half = math.atanh(r), 1.96 / math.sqrt(len(xs) - 3)
    return r, math.tanh(z - half), math.tanh(z + half)


def pipelines(cores: int) -> Dict[str, Tuple[object, int]]:
    """Each pool setting's name -> (an iterator over its batches, its batch size)."""
    from bwopt.workload import Workload

    built = {}
    pools = {"shared pool": 0, f"private pool of {cores}": cores, "private pool of 1": 1}  # one of 1 on 1 core
    for name, size in pools.items():
        config, _ = compose([*WORKLOAD, f"pipeline.options.private_threadpool_size={size}"])
        if not built:
            configure_devices(config)
        workload = Workload(config)
        workload.prepare()
        workload.build()
        batches = iter(workload.distributed_dataset(training=True))
        for _ in range(5):  # the first batches fill its buffers
            next(batches)
        built[name] = (batches, config.train.global_batch_size)
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of windows")
    parser.add_argument("--window", type=float, default=WINDOW_S, help="seconds per pipeline window")
    args = parser.parse_args()
    import numpy as np

    cores = len(os.sched_getaffinity(0))
    print(
        f"machine_noise: {args.rounds} rounds of {args.window:g} s windows of one pipeline on three thread pools, "
        f"then memcpy and compute; {load_line()}",
        flush=True,
    )
    sides = pipelines(cores)
    source, target = np.ones(COPY_BYTES // 8), np.empty(COPY_BYTES // 8)
    matrix = np.random.default_rng(0).random((256, 256))
    rates: Dict[str, List[float]] = {name: [] for name in sides}
    cpu_ms: Dict[str, List[float]] = {name: [] for name in sides}
    references: Dict[str, List[float]] = {"memcpy": [], "compute": []}
    order, started = random.Random(0), time.perf_counter()
    for _ in range(args.rounds):
        names = list(sides)
        order.shuffle(names)
        for name in names:
            batches, batch_size = sides[name]
            time.sleep(SETTLE_S)  # the pipeline before it goes idle
            per_s, cpu_s = window(lambda: next(batches), args.window)
            rates[name].append(per_s * batch_size)
            cpu_ms[name].append(cpu_s * 1e3 / batch_size)
        time.sleep(SETTLE_S)
        references["memcpy"].append(window(lambda: np.copyto(target, source), args.window)[0] * COPY_BYTES / 1e9)
        references["compute"].append(window(lambda: matrix @ matrix, args.window)[0])
    print(f"{args.rounds} rounds, {time.perf_counter() - started:.0f} s")
    for name, values in rates.items():
        median = statistics.median(values)
        slow = sum(value < SLOW * median for value in values)
        print(
            f"  {name:<20} examples/s median {median:,.0f}, spread {spread_of(values):.1%}, "
            f"{slow} of {len(values)} windows under {SLOW:g} of the median; "
            f"CPU-ms per example median {statistics.median(cpu_ms[name]):.4f}, max {max(cpu_ms[name]):.4f}; "
            f"cores busy median {statistics.median(r * c / 1e3 for r, c in zip(values, cpu_ms[name])):.2f}"
        )
    for name, values in references.items():
        print(f"  {name:<20} median {statistics.median(values):,.2f}, spread {spread_of(values):.1%}")
    shared = rates["shared pool"]
    for name in list(sides)[1:]:
        print(f"ratio {name} / shared pool: {spread([a / b for a, b in zip(rates[name], shared)])}")
    for name, values in references.items():
        # Levels share any slow drift over the minutes; changes from one round to the next do not.
        for what, xs, ys in (
            ("", shared, values),
            (", round-to-round changes", differences(shared), differences(values)),
        ):
            r, low, high = correlation(xs, ys)
            said = "the pipeline slows with it" if low > 0 else "no relation detected" if high > 0 else "opposed"
            print(f"correlation shared pool / {name}{what}: r = {r:.2f} (95 % CI {low:.2f} to {high:.2f})  {said}")


def differences(values: Sequence[float]) -> List[float]:
    """Each value minus the one before it."""
    return [after - before for before, after in zip(values, values[1:])]


def spread_of(values: Sequence[float]) -> float:
    """Standard deviation over the mean (0 for one value)."""
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


if __name__ == "__main__":
    main()
