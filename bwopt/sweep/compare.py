"""Which override set of a sweep is faster, beyond the noise.

Each set's throughput is estimated on a log scale from its finished repeats (their mean, with an
error that takes the larger of the spread between repeats, pooled over the sets and widened by
Student's t for its few degrees of freedom, and each run's own 95 % interval:
bwopt.measure.uncertainty.log_estimate); every set is compared with the leader (the highest
estimate) as a ratio with its 95 % interval and a word: faster, slower or no difference detected,
as Google Benchmark's compare.py and Criterion report. The leader is named best only when it
beats every other set beyond the noise; otherwise the sentence says which settings tie and about
how many repeats per setting would resolve a difference of the size seen.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from bwopt.measure.uncertainty import Comparison, compare, log_estimate, pooled_log_spread, repeats_to_resolve

# name -> (throughputs of the finished repeats, each repeat's 95 % interval or None)
Measured = Dict[str, Tuple[List[float], List[Optional[Sequence[float]]]]]


@dataclass
class Ranking:
    """The sets ordered by estimate (leader first), each compared with the leader.

    Attributes:
        order: names, leader first.
        against_leader: name -> that set / the leader (the leader itself is absent).
        best: the leader, when it beats the runner-up beyond the noise; else None.
        sentence: one line that says so, with the interval.
    """

    order: List[str]
    against_leader: Dict[str, Comparison] = field(default_factory=dict)
    best: Optional[str] = None
    sentence: str = ""


def rank(measured: Measured) -> Ranking:
    """Compare every set that finished with the leader; `measured` holds only sets with a throughput."""
    pooled = pooled_log_spread([values for values, _ in measured.values()])
    estimates = {
        name: log_estimate(values, intervals, pooled) for name, (values, intervals) in measured.items() if values
    }
    order = sorted(estimates, key=lambda name: estimates[name][0], reverse=True)
    if not order:
        return Ranking([], sentence="No setting finished: nothing to compare.")
    leader = order[0]
    if len(order) == 1:
        return Ranking(order, best=leader, sentence=f"Only {leader} finished: nothing to compare it with.")
    against = {name: compare(estimates[name], estimates[leader]) for name in order[1:]}
    ties = [name for name in order[1:] if against[name].word == "no difference detected"]
    # The runner-up by estimate need not be the closest call: a setting further down with a wider
    # interval can still overlap the leader, and then there is no best.
    runner_up = ties[0] if ties else order[1]
    lead = compare(estimates[leader], estimates[runner_up])
    if not ties:
        sentence = f"Best: {leader}, {_interval(lead)} against the runner-up {runner_up}: faster beyond the noise."
        return Ranking(order, against, leader, sentence)
    repeats = min(len(measured[name][0]) for name in (leader, runner_up))
    needed = repeats_to_resolve(lead, repeats)
    more = f"; about {needed} repeats per setting would resolve a difference this size" if needed else ""
    sentence = (
        f"No best: {leader} and {', '.join(ties)} tie ({leader} vs {runner_up}: {_interval(lead)}, "
        f"no difference detected){more} (hydra.launcher.repeats)."
    )
    return Ranking(order, against, None, sentence)


def _interval(comparison: Comparison) -> str:
    low, high = comparison.ci95
    return f"×{comparison.ratio:.2f} (95 % CI ×{low:.2f}–×{high:.2f})"
