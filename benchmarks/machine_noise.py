"""Where run-to-run noise comes from: an input pipeline's rate window by window, on TensorFlow's
shared thread pool and on a private one, against the machine's memory bandwidth and compute speed.

A tuning compares fresh processes whose throughput scatters by 10-25 % on this machine. This script
asks whether that scatter belongs to the machine or to the pipeline's process. One process builds
bwopt's training pipeline of `experiment=pipelines pipeline=naive pipeline.vectorized_map=true`
(`mode=input`'s distributed dataset) three times, differing only in the thread pool its functions
run on (`pipeline.options.private_threadpool_size`: 0, TensorFlow's shared inter-op pool; the
cores; 1), and a fourth time on the shared pool calling its map on two batches at once
(`pipeline.map_parallelism=2`; the others call it on one batch at a time, each op split over the
pool's threads), and takes turns, round after round, between

- a window of each pipeline, in a new seeded order each round, each after a pause of 1 s, not
  measured, in which the pipeline before it goes idle (measured inside the next window, a
  pipeline's leftover work slowed a matrix product from 2,600 to 62 per second): examples/s and
  the process's CPU milliseconds per example;
- after another pause, `memcpy`: one 64 MiB NumPy array copied into another, GB/s (the host's
  memory bandwidth, as bwopt's `host memcpy` line measures it), and `compute`: a 256x256 float64
  matrix product, products/s (arithmetic in the cache).

Measured after the pipeline, the references cannot see what the machine did during its window, so
a canary thread (`Canary`) times, every 0.1 s while the pipelines run, a fixed pure-Python loop by
its own CPU time (the core's speed) and four additions over a 2 MiB array (the caches' speed).
Then, unless `--series 0`, the shared pool runs without pauses in 0.5 s windows for `--series`
seconds (360): how much of the time its slow episodes take, how long they last, and how the rate
of blocks as long as a run's timed window scatters (3 s, `measure.min_timed_s`'s default; 15, 30,
60 s): how long runs must be for the episodes to average out.

Printed per pipeline: the median rate, its window-to-window spread (standard deviation over the
mean), the windows slower than 0.6 of its median ("slow episodes"), the median and largest CPU
per example, the cores it kept busy (rate x CPU per example); the ratio of every other side to
the shared pool per round (`_common.spread`: geometric mean, 95 % interval, median, min-max); and
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

With the canary (2026-12-05, 40 rounds, load 1.7): the shared pool's windows scattered by 32.6 %,
11 of 40 slow (CPU per example up to 2.6x its median, the pool's threads as busy as in the fast
windows); the canary's loop took 0.729 CPU-ms in those windows and 0.730 in the others (r = -0.03,
-0.34 to 0.29), its additions ran faster in them (0.183 against 0.212 ms: the slowed pipeline
leaves the caches to it). The core and the caches kept their speed: the episodes are TensorFlow's
work taking two to three times the CPU time, not a slower machine. Without pauses (720 windows of
0.5 s), 20 % of the time went in 17 slow episodes of 0.5-18.5 s (median 2.5), and blocks of 3 s
scattered by 24.5 % (the slowest 0.42 of their median), of 15 s by 18.5 %, of 30 s by 16.3 %, of
60 s by 9.7 %: to halve the run-to-run spread, a run's timed window must grow twentyfold.

With the map called on two batches at once (run 5, 40 rounds, 563 s, load 1.6): its windows
scattered by 8.0 %, none slow, 1.94 cores busy, at 1.172 (95 % CI 1.087-1.264) the shared pool's
rate, where the shared pool scattered by 22.5 % with 6 of 40 slow (the canary's loop again the same
in them, 0.735 against 0.747 CPU-ms). The episodes belong to one map call whose ops split over the
cores, not to every pipeline on these cores.

Run: `.venv/bin/python benchmarks/machine_noise.py [--rounds N] [--window S] [--series S]` (40 rounds
of 1.5 s pipeline windows, 4 sides, and a 360 s series, about 16 min); `BWOPT_BENCHMARK_SMOKE=1` runs three
short rounds and a 3 s series (the smoke test).
"""

import argparse
import math
import os
import random
import statistics
import threading
import time
from typing import Callable, Dict, List, Sequence, Tuple

from _common import QUIET, SMOKE, compose, configure_devices, load_line, spread

from bwopt.measure.episodes import SLOW_SHARE, slow_stretches

ROUNDS = 3 if SMOKE else 40
WINDOW_S = 0.2 if SMOKE else 1.5
SETTLE_S = 0.05 if SMOKE else 1.0
SERIES_S = 3.0 if SMOKE else 360.0
SERIES_WINDOW_S = 0.5
SERIES_BLOCKS_S = (3, 15, 30, 60)  # a run's timed window: 3 s is measure.min_timed_s's default
SLOW = SLOW_SHARE  # a window below this share of its pipeline's median rate is a slow episode
CANARY_EVERY_S = 0.1
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


class Canary:
    """A thread that, every 0.1 s while the pipeline runs, times two fixed pieces of work: a
    pure-Python loop by its own thread's CPU time (the core's speed: neither waiting for a core nor
    the GIL counts) and four additions over a 2 MiB NumPy array by the clock (the caches' speed).
    If the pipeline's slow windows came from the machine (a slower core, caches or memory taken by
    other tenants), these would slow with them; it costs the pipeline about 1 % of a core."""

    def __init__(self) -> None:
        import numpy as np

        self.cache = np.ones(2 * 2**20 // 8)
        self.samples: List[Tuple[float, float, float]] = []  # (time, loop CPU-ms, additions ms)
        self.running = True
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        import numpy as np

        while self.running:
            cpu_started = time.thread_time()
            total = 0
            for number in range(30_000):
                total += number
            loop_ms = (time.thread_time() - cpu_started) * 1e3
            started = time.perf_counter()
            for _ in range(4):
                np.add(self.cache, 1.0, out=self.cache)
            self.samples.append((time.perf_counter(), loop_ms, (time.perf_counter() - started) * 1e3))
            time.sleep(CANARY_EVERY_S)

    def during(self, start: float, end: float) -> Tuple[float, float]:
        """(median loop CPU-ms, median additions ms) of the samples taken between `start` and `end`."""
        inside = [(loop, cache) for at, loop, cache in self.samples if start <= at <= end] or self.samples[-1:]
        return statistics.median(x for x, _ in inside), statistics.median(y for _, y in inside)

    def stop(self) -> None:
        self.running = False
        self.thread.join()


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
    """Each side's name -> (an iterator over its batches, its batch size)."""
    from bwopt.workload import Workload

    built = {}
    sides = {
        "shared pool": [],
        f"private pool of {cores}": [f"pipeline.options.private_threadpool_size={cores}"],
        "private pool of 1": ["pipeline.options.private_threadpool_size=1"],  # one of 1 on 1 core
        # the shared pool again, the map called on two batches at once (the pools' sides call it on
        # one at a time, its ops split over the pool's threads)
        "two map calls at once": ["pipeline.map_parallelism=2"],
    }
    for name, overrides in sides.items():
        config, _ = compose([*WORKLOAD, *overrides])
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
    parser.add_argument(
        "--series", type=float, default=SERIES_S, help="seconds of the shared pool without pauses (0: none)"
    )
    args = parser.parse_args()
    import numpy as np

    cores = len(os.sched_getaffinity(0))
    print(
        f"machine_noise: {args.rounds} rounds of {args.window:g} s windows of one pipeline on three thread pools "
        "and with two map calls at once, "
        f"then memcpy and compute; {load_line()}",
        flush=True,
    )
    sides = pipelines(cores)
    source, target = np.ones(COPY_BYTES // 8), np.empty(COPY_BYTES // 8)
    matrix = np.random.default_rng(0).random((256, 256))
    rates: Dict[str, List[float]] = {name: [] for name in sides}
    cpu_ms: Dict[str, List[float]] = {name: [] for name in sides}
    during: Dict[str, List[Tuple[float, float]]] = {name: [] for name in sides}
    canary = Canary()
    references: Dict[str, List[float]] = {"memcpy": [], "compute": []}
    order, started = random.Random(0), time.perf_counter()
    for _ in range(args.rounds):
        names = list(sides)
        order.shuffle(names)
        for name in names:
            batches, batch_size = sides[name]
            time.sleep(SETTLE_S)  # the pipeline before it goes idle
            window_started = time.perf_counter()
            per_s, cpu_s = window(lambda: next(batches), args.window)
            rates[name].append(per_s * batch_size)
            cpu_ms[name].append(cpu_s * 1e3 / batch_size)
            during[name].append(canary.during(window_started, time.perf_counter()))
        time.sleep(SETTLE_S)
        references["memcpy"].append(window(lambda: np.copyto(target, source), args.window)[0] * COPY_BYTES / 1e9)
        references["compute"].append(window(lambda: matrix @ matrix, args.window)[0])
    canary.stop()
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
            said = relation(low, high)
            print(f"correlation shared pool / {name}{what}: r = {r:.2f} (95 % CI {low:.2f} to {high:.2f})  {said}")
    print_canary(rates["shared pool"], during["shared pool"])
    if args.series > 0:
        print_series(sides["shared pool"], args.series)


def print_canary(rates: Sequence[float], during: Sequence[Tuple[float, float]]) -> None:
    """The core's and the caches' speed during the shared pool's windows (the canary's medians),
    in its slow windows against the others, and the correlation with its rate."""
    median = statistics.median(rates)
    for index, what in ((0, "core (loop CPU-ms)"), (1, "caches (additions ms)")):
        slow = [times[index] for rate, times in zip(rates, during) if rate < SLOW * median]
        others = [times[index] for rate, times in zip(rates, during) if rate >= SLOW * median]
        speeds = [1 / times[index] for times in during]
        r, low, high = correlation(rates, speeds) if len(set(speeds)) > 1 else (0.0, -1.0, 1.0)
        said = relation(low, high)
        slow_text = f"{statistics.median(slow):.3f} in its {len(slow)} slow windows" if slow else "no slow window"
        print(
            f"canary {what} during the shared pool's windows: median {statistics.median(others):.3f} in the others, "
            f"{slow_text}; correlation of its speed with the pipeline's rate r = {r:.2f} "
            f"(95 % CI {low:.2f} to {high:.2f})  {said}"
        )


def print_series(side: Tuple[object, int], seconds: float) -> None:
    """The shared pool without pauses in 0.5 s windows for `seconds`: the share of time in slow
    windows, how long its slow episodes last, and how the rate of blocks as long as a run's timed
    window (3 s by default, 15, 30, 60 s) scatters: how long a run must be to average them out."""
    batches, batch_size = side
    windows = range(int(seconds / SERIES_WINDOW_S))
    rates = [window(lambda: next(batches), SERIES_WINDOW_S)[0] * batch_size for _ in windows]
    median = statistics.median(rates)
    slow, episodes = slow_stretches(rates, [SERIES_WINDOW_S] * len(rates), SLOW)
    lasting = ""
    if episodes:
        lasting = f" lasting {min(episodes):g}-{max(episodes):g} s (median {statistics.median(episodes):g})"
    slow_share = float(slow.mean())
    print(
        f"series of the shared pool, {len(rates)} windows of {SERIES_WINDOW_S:g} s without pauses: "
        f"median {median:,.0f} examples/s, {slow_share:.0%} of the time in {len(episodes)} slow episodes{lasting}"
    )
    for block_s in SERIES_BLOCKS_S:
        size = round(block_s / SERIES_WINDOW_S)
        blocks = [statistics.mean(rates[i : i + size]) for i in range(0, len(rates) - size + 1, size)]
        if len(blocks) >= 3:
            print(
                f"  blocks of {block_s} s: spread {spread_of(blocks):.1%} over {len(blocks)}, "
                f"slowest {min(blocks) / statistics.median(blocks):.2f} of their median"
            )


def relation(low: float, high: float) -> str:
    """What a correlation's 95 % interval says of the pipeline's rate and a reference's speed."""
    return "the pipeline slows with it" if low > 0 else "no relation detected" if high > 0 else "opposed"


def differences(values: Sequence[float]) -> List[float]:
    """Each value minus the one before it."""
    return [after - before for before, after in zip(values, values[1:])]


def spread_of(values: Sequence[float]) -> float:
    """Standard deviation over the mean (0 for one value)."""
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


if __name__ == "__main__":
    main()
