"""Slow episodes: stretches of a run's timed window in which its rate fell well below its own median.

A run's throughput interval (bwopt.measure.uncertainty) resamples blocks of its steps, so it says
how much the figure would move were the same window measured again. It cannot say that the window
itself was uneven: on 2 CPU cores a tf.data map whose ops split over both cores spends stretches
of 0.5-18 s at a half or a third of its rate (`benchmarks/machine_noise.py`), and a 3 s window
that holds one reads 20-40 % low, with a narrow interval. The next run of the same settings,
without one, reads fast. Such a run's figure is one draw from a wide spread, and only repeats
show it.

The timed steps are cut, in order, into windows of at least `WINDOW_S` of step time (a window
closes with the step that takes it past `WINDOW_S`; what is left at the end joins the last
window). A window whose rate (examples / its step time) is below `SLOW_SHARE` of the median
window rate is slow; an episode is a run of consecutive slow windows. With fewer than
`MIN_WINDOWS` windows nothing is said. A run slow throughout has its median there too, and
no episode: they are relative to the run itself (its windows' spread may still show it).
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

WINDOW_S = 0.5
SLOW_SHARE = 0.6
MIN_WINDOWS = 4


@dataclass
class Episodes:
    """How even the rate of a run's timed window was.

    Attributes:
        rate_window_spread: standard deviation of the windows' rates over their mean.
        slow_time_fraction: share of the timed step time spent in slow windows.
        slow_episodes: runs of consecutive slow windows.
        longest_slow_episode_s: step time of the longest one (0 when there is none).
        rate_windows: windows the timed steps were cut into.
    """

    rate_window_spread: float
    slow_time_fraction: float
    slow_episodes: int
    longest_slow_episode_s: float
    rate_windows: int


def windows(step_s: np.ndarray, window_s: float = WINDOW_S) -> List[slice]:
    """Consecutive slices of `step_s`, each of at least `window_s` of step time but the last, which
    joins the one before it when shorter."""
    cuts, total = [0], 0.0
    for index, seconds in enumerate(step_s, 1):
        total += seconds
        if total >= window_s * (1 - 1e-9):  # sums of step times round
            cuts.append(index)
            total = 0.0
    if cuts[-1] != len(step_s):
        if len(cuts) > 1:
            cuts[-1] = len(step_s)
        else:
            cuts.append(len(step_s))
    return [slice(start, end) for start, end in zip(cuts, cuts[1:])]


def slow_stretches(rates, seconds, slow_share: float = SLOW_SHARE) -> Tuple[np.ndarray, List[float]]:
    """(which windows are slow, the seconds of each episode in order) for windows of `rates` that
    lasted `seconds` each: slow below `slow_share` of the median rate, an episode a run of them."""
    rates, seconds = np.asarray(rates, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    slow = rates < slow_share * np.median(rates)
    lengths, current = [], 0.0
    for is_slow, duration in zip(slow, seconds):
        if is_slow:
            current += duration
        elif current:
            lengths.append(current)
            current = 0.0
    if current:
        lengths.append(current)
    return slow, lengths


def slow_episodes(step_s, window_s: float = WINDOW_S, slow_share: float = SLOW_SHARE) -> Optional[Episodes]:
    """The episodes of a run whose timed loop steps took `step_s` seconds each (each step the same
    examples); None when the steps make fewer than `MIN_WINDOWS` windows."""
    step_s = np.asarray(step_s, dtype=np.float64)
    cut = windows(step_s, window_s)
    if len(cut) < MIN_WINDOWS:
        return None
    seconds = np.array([step_s[part].sum() for part in cut])
    rates = np.array([part.stop - part.start for part in cut]) / seconds
    slow, lengths = slow_stretches(rates, seconds, slow_share)
    return Episodes(
        rate_window_spread=float(rates.std(ddof=1) / rates.mean()),
        slow_time_fraction=float(seconds[slow].sum() / seconds.sum()),
        slow_episodes=len(lengths),
        longest_slow_episode_s=float(max(lengths, default=0.0)),
        rate_windows=len(cut),
    )
