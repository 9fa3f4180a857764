"""The order in which `tune` tries its changes: greedy by the gain the cost model predicts.

From the start's `Profile` every candidate change (vectorised maps, a lossless transfer dtype,
parallelism by water-filling, a cache, prefetch depth, the map and the batch fused, steps per
execution, batches fetched to an accelerator) is applied to the model in turn; the one with the
largest predicted gain is taken, the model updated, and the rest weighed again on top of it,
until no candidate is predicted to gain `MIN_PREDICTED_GAIN`; then the changes to the math or the pixels that
hydra.sweeper.allow lets in (`OPT_IN`: a 16-bit precision, a larger batch, JPEGs decoded whole into a
cache). Each proposal carries its overrides and a one-line reason with the numbers it came from.
Pure: no TensorFlow, no Hydra (bwopt.sweep.tune_decide holds the model, bwopt.sweep.tune_changes
and bwopt.sweep.tune_opt_in the candidates).
`busy_cores_reason` says which proposals a measured trial leaves no room for; `together` makes one
proposal of changes that each stayed within the noise alone.
"""

import math
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from bwopt.measure.advice import cores_bound
from bwopt.sweep.tune_changes import CANDIDATES, candidate_name, initial_state, predicted_batch_time_s
from bwopt.sweep.tune_decide import MIN_PREDICTED_GAIN, Budget, Profile, Proposal
from bwopt.sweep.tune_opt_in import OPT_IN

if TYPE_CHECKING:
    from bwopt.sweep.tune_record import Trial


# The opt-in proposals: past the target fraction of the compute ceiling they are still tried (the
# user named them), since they move a ceiling: a 16-bit policy and a larger batch the compute
# ceiling, whole images decoded into a cache the cores ceiling (the decoding leaves the cores the
# step shares).
OPT_IN_NAMES = frozenset(candidate_name(candidate) for candidate in OPT_IN.values())


def plan(
    profile: Profile, budget: Budget, start: dict, kept=(), rejected=(), allow: Sequence[str] = ()
) -> List[Proposal]:
    """The proposals, best predicted gain first, each weighed on top of those before it.

    `kept` and `rejected` name proposals already run (`Proposal.name`): the kept ones are applied
    first, in their order, and the rejected ones are left out, so after a revert the rest are
    weighed again on top of what was kept rather than of the change that did not help. `allow`
    (hydra.sweeper.allow) lets in changes that alter the math (`OPT_IN`): they come after every change that
    keeps it, in `allow`'s order.
    """
    state = initial_state(profile, start)
    proposals: List[Proposal] = []
    opt_in = {candidate_name(OPT_IN[name]): OPT_IN[name] for name in allow if name in OPT_IN}
    by_name = {**{candidate_name(candidate): candidate for candidate in CANDIDATES}, **opt_in}
    unknown = [name for name in (*kept, *rejected) if name not in by_name]
    if unknown:
        raise ValueError(f"unknown proposal(s) {unknown}; expected some of {list(by_name)}")
    for name in kept:
        outcome = by_name[name](state, profile, budget)
        if outcome is None:  # the model already holds it
            continue
        current = predicted_batch_time_s(state, budget)
        state, overrides, reason = outcome
        gain = current / predicted_batch_time_s(state, budget)
        proposals.append(
            Proposal(name, overrides, f"{reason} (model: ×{gain:.2f})", predicted_batch_time_s(state, budget), gain)
        )
    remaining = [candidate for name, candidate in by_name.items() if name not in (*kept, *rejected, *opt_in)]
    while remaining:
        current = predicted_batch_time_s(state, budget)
        options = []
        for candidate in remaining:
            outcome = candidate(state, profile, budget)
            if outcome is not None:
                options.append((current / predicted_batch_time_s(outcome[0], budget), candidate, outcome))
        options = [option for option in options if option[0] >= MIN_PREDICTED_GAIN]
        if not options:
            break
        gain, candidate, (state, overrides, reason) = max(options, key=lambda option: option[0])
        remaining.remove(candidate)
        predicted = predicted_batch_time_s(state, budget)
        proposals.append(
            Proposal(candidate_name(candidate), overrides, f"{reason} (model: ×{gain:.2f})", predicted, gain)
        )
    for name, candidate in opt_in.items():
        if name in (*kept, *rejected):
            continue
        current = predicted_batch_time_s(state, budget)
        outcome = candidate(state, profile, budget)
        if outcome is None or current / predicted_batch_time_s(outcome[0], budget) < MIN_PREDICTED_GAIN:
            continue
        state, overrides, reason = outcome
        predicted = predicted_batch_time_s(state, budget)
        gain = current / predicted
        proposals.append(Proposal(name, overrides, f"{reason} (model: ×{gain:.2f})", predicted, gain))
    return proposals


# Proposals that only add overlap or threads: with every core busy they cannot make a run faster.
# The share of its cores a trial's training must keep busy, measured, for threads and overlap to be skipped.
BUSY_SHARE = 0.85
CONCURRENCY = ("parallelize", "prefetch")


def busy_cores_reason(proposal_name: str, incumbent: "Trial") -> Optional[str]:
    """Why a proposal that only adds threads or overlap is not tried on `incumbent`: every core is
    busy (at 90 % or more of its cores ceiling, below the other ceilings, and, where measured, at
    least `BUSY_SHARE` of its cores held by training: kept busy, or held idle by a step that spans
    them, `Trial.cores_held`); None when it may help."""
    others = [value for value in (incumbent.compute_ceiling, incumbent.input_ceiling) if value]
    if proposal_name not in CONCURRENCY or not incumbent.throughput:
        return None
    if not cores_bound(incumbent.throughput, incumbent.cores_ceiling, others):
        return None
    busy, held, cores = incumbent.cores_busy, incumbent.cores_held, incumbent.cores_available
    if held is not None and cores and held < BUSY_SHARE * cores:  # the estimate says busy, the clock does not
        return None
    measured = "" if busy is None else f", {busy:.2f} cores busy"
    if held is not None and busy is not None and held > busy + 0.005:
        measured += f", {held:.2f} held by training with the step's idle share"
    return (
        f"every core busy: trial {incumbent.number} runs at {incumbent.throughput / incumbent.cores_ceiling:.2f} "
        f"of its cores ceiling ({incumbent.cores_ceiling:,.0f} examples/s{measured}), so more threads or overlap "
        "cannot make it faster"
    )


def together(undecided: Sequence[Tuple[Proposal, "Trial"]]) -> Optional[Proposal]:
    """One proposal of two or more changes that each, run alone, stayed within the noise (their
    trials' comparisons undecided): their gains multiply, so together they may clear the noise that
    each alone could not (on a pipeline whose one-call map scatters by a fifth from run to run, more
    map calls at once and a prefetch each read ×1.05-×1.16 over six rounds, together ×1.23). The
    model's gain is the product of the gains it expected of each. None for fewer than two."""
    if len(undecided) < 2:
        return None
    overrides = {key: value for proposal, _ in undecided for key, value in proposal.overrides.items()}
    gain = math.prod(proposal.gain for proposal, _ in undecided)
    alone = ", ".join(
        f"{proposal.name} ×{trial.against_incumbent.ratio:.2f} (trial {trial.number})"
        for proposal, trial in undecided
        if trial.against_incumbent is not None
    )
    reason = (
        f"each alone within the noise ({alone}); run as one change, their gains together may clear it "
        f"(model: ×{gain:.2f}, the product of what it expected of each)"
    )
    parts = tuple(proposal.name for proposal, _ in undecided)
    return Proposal(" + ".join(parts), overrides, reason, 0.0, gain, parts)
