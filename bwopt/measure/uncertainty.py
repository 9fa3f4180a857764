"""How sure a figure is: 95 % intervals by a block bootstrap over the timed steps, the step as a
partition, and verdicts that hold only where their interval clears the thresholds.

Neighbouring steps are not independent (a slow phase of the machine, a pipeline refilling its
buffers spans many steps), so resampling single steps would make the intervals too narrow. The
bootstrap resamples *blocks* of consecutive timed loop steps (a moving-block bootstrap, block
length about n^(1/3), longer the longer neighbouring steps stay alike, at least 4 steps),
`NUM_RESAMPLES` times with a fixed seed, recomputes each figure as a ratio of sums over the
resampled steps, and takes the 2.5th and 97.5th percentiles.
The interval says how much the figure would move were the same run's window measured again;
a share of step time also holds the batch-means interval of its half-second windows
(`window_means_interval`), since what drifts over seconds escapes blocks a few steps long.
What changes between runs (another process on the cores) adds to that, which is why sweeps
compare repeats (`compare`).
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

NUM_RESAMPLES = 1000
MIN_BLOCK_STEPS = 4
CONFIDENCE = 0.95
Z_95 = 1.959964

# The parts of a step, in the order they are printed.
PARTS = ("compute", "input_stall", "host_overhead", "other")


def block_length(num_steps: int, lag1_autocorrelation: float = 0.0) -> int:
    """Steps per block: n^(1/3) scaled by how long the steps stay alike (for a lag-1 correlation
    rho, by (2 rho / (1 - rho^2))^(2/3), the optimal block length of an AR(1) series, Politis &
    White 2004), at least MIN_BLOCK_STEPS and at most a quarter of the steps."""
    rho = min(max(lag1_autocorrelation, 0.0), 0.95)
    scale = (2 * rho / (1 - rho**2)) ** (2 / 3)
    return int(max(MIN_BLOCK_STEPS, min(math.ceil(num_steps ** (1 / 3) * scale), num_steps // 4)))


def lag1_autocorrelation(values: np.ndarray) -> float:
    centred = values - values.mean()
    denominator = float(np.dot(centred, centred))
    return float(np.dot(centred[:-1], centred[1:]) / denominator) if denominator > 0 and len(values) > 2 else 0.0


def block_bootstrap_sums(parts: np.ndarray, seed: int = 0, step_time: Optional[np.ndarray] = None) -> np.ndarray:
    """Sums over resampled steps: shape (NUM_RESAMPLES, num_parts) for `parts` of shape (num_steps, num_parts).

    Each resample joins randomly started blocks of consecutive steps (wrapping around the end)
    until it has as many steps as the original window; the blocks are as long as `step_time`
    (default: the rows' sums) stays alike from step to step. A window too short for two blocks of
    `MIN_BLOCK_STEPS` is cut into at least two shorter ones: one block would resample the window
    as it is, an interval of zero width that claims a certainty the few steps do not give.
    """
    num_steps = len(parts)
    step_time = parts.sum(axis=1) if step_time is None else step_time
    length = block_length(num_steps, lag1_autocorrelation(step_time))
    length = max(1, min(length, num_steps // 2))
    num_blocks = math.ceil(num_steps / length)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, num_steps, size=(NUM_RESAMPLES, num_blocks))
    indices = (starts[:, :, None] + np.arange(length)[None, None, :]).reshape(NUM_RESAMPLES, -1)[:, :num_steps]
    return parts[indices % num_steps].sum(axis=1)


def interval(values: np.ndarray, estimate: Optional[float] = None) -> List[float]:
    """[low, high]: the central 95 % of bootstrap values, widened to hold `estimate`.

    A percentile interval need not hold its own figure: a share clipped at a bound (a stall that
    sums below zero over the window moves into compute) sits at the edge of its resamples' spread,
    and the 97.5th percentile can fall a hair below it. An interval that excludes the figure it
    qualifies reads as a contradiction, so it is stretched to the figure.
    """
    low, high = np.percentile(values, [100 * (1 - CONFIDENCE) / 2, 100 * (1 + CONFIDENCE) / 2])
    if estimate is not None:
        low, high = min(low, estimate), max(high, estimate)
    return [float(low), float(high)]


@dataclass(frozen=True)
class StepUncertainty:
    """The intervals of the timing figures and the step's partition with its intervals.

    Attributes:
        throughput_ci95: [low, high] of the examples/s over the timed window.
        partition: part -> share of step time (`PARTS`; the shares sum to 1).
        partition_ci95: part -> [low, high].
        series_ci95: name -> [low, high] of the share of step time of each series passed in.
    """

    throughput_ci95: List[float]
    partition: Dict[str, float]
    partition_ci95: Dict[str, List[float]]
    series_ci95: Dict[str, List[float]] = field(default_factory=dict)


def clip_stall(sums: np.ndarray) -> np.ndarray:
    """Sums of the parts with a negative stall sum (executions faster than their reference, noise)
    set to 0 and moved into compute: the shares stay a partition."""
    stall, compute = PARTS.index("input_stall"), PARTS.index("compute")
    negative = np.minimum(sums[..., stall], 0.0)
    sums = sums.copy()
    sums[..., stall] -= negative
    sums[..., compute] += negative
    return sums


def partition_shares(parts: Dict[str, np.ndarray]) -> Dict[str, float]:
    """Each part's share of the step time over all steps (`PARTS`; a negative stall sum clipped)."""
    totals = clip_stall(np.array([float(np.sum(parts[name])) for name in PARTS]))
    return {name: float(totals[index] / totals.sum()) for index, name in enumerate(PARTS)}


def widened(bounds: Sequence[float], values: Sequence[float]) -> List[float]:
    """[low, high] stretched to hold every one of `values`."""
    return [float(min(bounds[0], *values)), float(max(bounds[1], *values))]


# The windows a batch-means interval needs (two degrees of freedom); fewer leave a share to the bootstrap.
MIN_SHARE_WINDOWS = 3


def window_means_interval(
    part_s: np.ndarray, step_s: np.ndarray, cuts: Sequence[slice], estimate: float
) -> Optional[List[float]]:
    """[low, high] of a share of step time by batch means: the share of `part_s` in each window of
    `cuts` (consecutive stretches of the steps), Student's t over the windows' scatter, centred on
    `estimate` (the whole window's figure). None with fewer than `MIN_SHARE_WINDOWS` windows.

    The blocks of the bootstrap are steps long; a share that drifts over seconds (a pipeline
    thread that gets a core for a while, then loses it) moves between windows of half a second,
    and between runs, by more than the bootstrap's interval says.
    """
    if len(cuts) < MIN_SHARE_WINDOWS:
        return None
    shares = np.array([part_s[cut].sum() / step_s[cut].sum() for cut in cuts])
    half = t_quantile(len(shares) - 1) * float(shares.std(ddof=1)) / math.sqrt(len(shares))
    return [estimate - half, estimate + half]


def step_uncertainty(
    parts: Dict[str, np.ndarray], examples_per_loop_step: float, series: Optional[Dict[str, np.ndarray]] = None
) -> StepUncertainty:
    """Intervals from per-loop-step seconds of each part (`PARTS` keys; their sum is the step time),
    and of the share of step time of each of `series` (seconds per loop step, e.g. the input wait)."""
    series = series or {}
    columns = [np.asarray(parts[name], dtype=np.float64) for name in PARTS]
    columns += [np.asarray(values, dtype=np.float64) for values in series.values()]
    matrix = np.stack(columns, axis=1)
    num_parts = len(PARTS)
    # Blocks as long as the step time stays alike: the other series ride along, they do not set it.
    sums = block_bootstrap_sums(matrix, step_time=matrix[:, :num_parts].sum(axis=1))
    walls = sums[:, :num_parts].sum(axis=1)
    shares = clip_stall(sums[:, :num_parts]) / walls[:, None]
    partition = partition_shares(parts)
    wall = float(matrix[:, :num_parts].sum())
    series_shares = matrix[:, num_parts:].sum(axis=0) / wall
    examples = len(matrix) * examples_per_loop_step
    return StepUncertainty(
        throughput_ci95=interval(examples / walls, examples / wall),
        partition=partition,
        partition_ci95={name: interval(shares[:, index], partition[name]) for index, name in enumerate(PARTS)},
        series_ci95={
            name: interval(sums[:, num_parts + index] / walls, float(series_shares[index]))
            for index, name in enumerate(series)
        },
    )


def percent_range(bounds: Sequence[float]) -> str:
    low, high = bounds
    return f"{low * 100:.0f}–{high * 100:.0f} %"


# --- comparisons -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A / B of two throughputs, with the ratio's interval (95 % unless `level` says otherwise) and a word.

    `word` is "faster" when the whole interval lies above 1, "slower" below 1, else
    "no difference detected". `level`: the interval's (95 %, or a sequential test's per-look level,
    `sequential_level`, which keeps the test's overall error rate at 5 %).
    """

    ratio: float
    ci95: Tuple[float, float]
    word: str
    level: float = CONFIDENCE

    @property
    def interval_name(self) -> str:
        return "95 % CI" if self.level == CONFIDENCE else f"{self.level * 100:.1f} % CI per look"

    def sentence(self, name: str, other: str) -> str:
        low, high = self.ci95
        return f"{name} vs {other}: ×{self.ratio:.2f} ({self.interval_name} ×{low:.2f}–×{high:.2f}), {self.word}"


def interval_error(bounds: Optional[Sequence[float]]) -> Optional[float]:
    """The standard error of one run's log throughput that its 95 % interval `bounds` implies (its
    log width / (2 x 1.96)); None where it has none, or one of zero width (one timed step), which
    says nothing of the noise."""
    if not bounds or not 0 < bounds[0] < bounds[1]:
        return None
    return (math.log(bounds[1]) - math.log(bounds[0])) / (2 * Z_95)


def log_estimate(
    values: Sequence[float],
    intervals: Sequence[Optional[Sequence[float]]],
    pooled: Optional[Tuple[float, int]] = None,
    level: float = CONFIDENCE,
) -> Tuple[float, float]:
    """(mean of log throughput, its standard error) over repeats of one setting.

    The error combines the spread between repeats and each run's own interval (its log width /
    (2 x 1.96)), taking the larger, so that two repeats that happen to agree do not claim more
    certainty than each run's window gives. The spread is this setting's own (from two or more
    repeats) or `pooled` (standard deviation of log throughput and its degrees of freedom, from
    `pooled_log_spread` over every setting of a sweep). A spread estimated from few repeats is
    itself uncertain: the between-repeat error is scaled by Student's t over 1.96 (×6.5 at 1
    degree of freedom, ×1.6 at 3), so that the normal interval `compare` draws is at least as
    wide as the t interval of each side; at another `level` (a sequential test's, `sequential_level`)
    by Student's t over the normal quantile of that level.
    """
    logs = np.log(np.asarray(values, dtype=np.float64))
    within = [error for error in map(interval_error, intervals) if error is not None]
    within_se = math.sqrt(np.mean(np.square(within)) / len(logs)) if within else 0.0
    if pooled is not None:
        spread, degrees = pooled
    elif len(logs) > 1:
        spread, degrees = float(np.std(logs, ddof=1)), len(logs) - 1
    else:
        spread, degrees = 0.0, 0
    if not within and not degrees:  # one run and no interval: nothing says how far it could move
        return float(logs.mean()), math.inf
    between_se = spread / math.sqrt(len(logs)) * t_over_z(degrees, level) if degrees else 0.0
    return float(logs.mean()), max(within_se, between_se)


def pooled_log_spread(groups: Sequence[Sequence[float]]) -> Optional[Tuple[float, int]]:
    """(pooled standard deviation of log throughput, its degrees of freedom) over the settings with
    two or more repeats, or None when none has: the machine's run-to-run noise, which every
    setting of one sweep shares (on a log scale, a spread in proportion to the throughput)."""
    squares, degrees = 0.0, 0
    for values in groups:
        if len(values) > 1:
            logs = np.log(np.asarray(values, dtype=np.float64))
            squares += float(np.sum(np.square(logs - logs.mean())))
            degrees += len(values) - 1
    return (math.sqrt(squares / degrees), degrees) if degrees else None


def t_quantile(degrees: float, level: float = CONFIDENCE) -> float:
    """Student's t, two-sided at `level` (95 %), at `degrees` degrees of freedom."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.5 + level / 2, degrees))


def z_of(level: float) -> float:
    """The normal quantile of a two-sided interval at `level` (1.96 at 95 %)."""
    return Z_95 if level == CONFIDENCE else float(statistics.NormalDist().inv_cdf(0.5 + level / 2))


def t_over_z(degrees: float, level: float = CONFIDENCE) -> float:
    """How much wider a spread estimated with `degrees` degrees of freedom makes a normal interval at `level`."""
    return t_quantile(degrees, level) / z_of(level)


def satterthwaite(parts: Sequence[Tuple[float, float]]) -> float:
    """The degrees of freedom of a sum of independent variance estimates, (variance, its degrees of freedom) each."""
    total = sum(part for part, _ in parts)
    return total**2 / sum(part**2 / degrees for part, degrees in parts if part > 0) if total > 0 else math.inf


# Pocock's constant nominal levels: a test looked at up to K times (equal shares of the data each
# time), each look two-sided at this level, errs at most 5 % of the time over all K together
# (Pocock 1977; Jennison & Turnbull, Group Sequential Methods, table 2.1: 2.178, 2.289, 2.361, 2.413).
POCOCK_Z = {1: Z_95, 2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}


def sequential_level(looks: int) -> float:
    """The two-sided level each of `looks` looks at one comparison takes so that the comparison as a
    whole keeps a 95 % interval's error rate (`POCOCK_Z`): a second look at more runs is not a
    second chance to call noise a win."""
    if looks not in POCOCK_Z:
        raise ValueError(f"looks={looks}; expected one of {sorted(POCOCK_Z)}")
    return CONFIDENCE if looks == 1 else 2 * statistics.NormalDist().cdf(POCOCK_Z[looks]) - 1


def compare(a: Tuple[float, float], b: Tuple[float, float], level: float = CONFIDENCE) -> Comparison:
    """A / B from two `log_estimate`s (made at the same `level`)."""
    difference = a[0] - b[0]
    error = math.sqrt(a[1] ** 2 + b[1] ** 2)
    z = z_of(level)
    low, high = math.exp(difference - z * error), math.exp(difference + z * error)
    word = "faster" if low > 1 else "slower" if high < 1 else "no difference detected"
    return Comparison(math.exp(difference), (low, high), word, level)


def rounds_to_find(comparison: Comparison, rounds: int, gain: float, power: float = 0.8) -> Optional[int]:
    """About how many rounds like the `rounds` behind `comparison` would find a true `gain` (the
    ratio one side is expected to have to the other) beyond the noise `power` of the time at the
    comparison's level: the usual sample size, its standard error narrowing as 1/sqrt(rounds), so
    rounds x ((z of the level + z of the power) x that error / log gain)^2. Priced from a gain
    expected beforehand (a model's), not from the ratio observed, which noise moves as much as
    the interval. None where `gain` is no gain or the interval is not finite."""
    low, high = comparison.ci95
    if gain <= 1.0 or not 0 < low <= high < math.inf:
        return None
    z = z_of(comparison.level)
    error = (math.log(high) - math.log(low)) / (2 * z)
    needed = rounds * ((z + statistics.NormalDist().inv_cdf(power)) * error / math.log(gain)) ** 2
    return max(1, math.ceil(needed))


def repeats_to_resolve(comparison: Comparison, repeats: int) -> Optional[int]:
    """About how many repeats per setting would make the observed difference clear its interval
    (the interval narrows as 1/sqrt(repeats)); None when there is no difference to resolve."""
    effect = abs(math.log(comparison.ratio))
    if not 0 < comparison.ci95[0] <= comparison.ci95[1] < math.inf:  # no interval to narrow
        return None
    half_width = (math.log(comparison.ci95[1]) - math.log(comparison.ci95[0])) / 2
    if effect < 1e-3 or half_width <= 0:
        return None
    return max(repeats + 1, math.ceil(max(repeats, 1) * (half_width / effect) ** 2))
