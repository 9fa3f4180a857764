"""The order in which `tune` tries its changes: greedy by the gain the cost model predicts.

From the start's `Profile` every candidate change (vectorised maps, a lossless transfer dtype,
parallelism by water-filling, a cache, prefetch depth, steps per execution) is applied to the
model in turn; the one with the largest predicted gain is taken, the model updated, and the rest
weighed again on top of it, until no candidate is predicted to gain `MIN_PREDICTED_GAIN`; then
the changes to the math that tune.allow lets in (`OPT_IN`: a 16-bit precision). Each
proposal carries its overrides and a one-line reason with the numbers it came from. Pure: no
TensorFlow, no Hydra (bwopt.sweep.tune_decide holds the model). `busy_cores_reason` says which
proposals a measured trial leaves no room for.
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from bwopt.measure.advice import cores_bound
from bwopt.sweep.tune_decide import (
    BATCH,
    MAP,
    MIN_PREDICTED_GAIN,
    SHUFFLE,
    SIXTEEN_BIT_SPEEDUP,
    SOURCE,
    Budget,
    Profile,
    Proposal,
    Stage,
    batch_time_s,
    cache_position,
    check_cache_position,
    prefetch_depth,
    producer_period_s,
    steps_per_execution,
    sustainable_rate,
    water_fill,
)

if TYPE_CHECKING:
    from bwopt.sweep.tune_record import Trial


@dataclass(frozen=True)
class State:
    """The model of the pipeline as the proposals taken so far leave it."""

    stages: Tuple[Stage, ...]
    map_parallelism: int = 1
    interleave_width: int = 1
    prefetch: int = 0
    cached: bool = False
    vectorized: bool = False
    uint8: bool = False
    steps_per_execution: int = 1
    step_time_s: float = 0.0
    bytes_per_example: float = 0.0
    precision: str = "float32"


def threads_of(state: State) -> dict:
    return {
        stage.name: state.interleave_width
        if stage.kind == SOURCE
        else state.map_parallelism
        if stage.kind == MAP
        else 1
        for stage in state.stages
    }


def predicted_batch_time_s(state: State, budget: Budget) -> float:
    return batch_time_s(state.stages, threads_of(state), state.step_time_s, budget.cores, state.prefetch)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def cache_slot(stages) -> Optional[int]:
    """Where bwopt's pipeline caches: after the last stage before the shuffle (bwopt.pipeline)."""
    for index, stage in enumerate(stages):
        if stage.kind in (SHUFFLE, BATCH):
            return index - 1 if index else None
    return None


# --- candidates: each returns (new state, proposal) or None -------------------------------------


def vectorize(state: State, profile: Profile, budget: Budget):
    maps = [stage for stage in state.stages if stage.kind == MAP]
    if state.vectorized or profile.vectorized_map_cost_s is None or not maps:
        return None
    per_element = sum(stage.cost_per_batch_s for stage in maps)
    vectorized_cost = profile.vectorized_map_cost_s
    kept = [stage for stage in state.stages if stage.kind != MAP]
    batch_at = next((index for index, stage in enumerate(kept) if stage.kind == BATCH), len(kept) - 1)
    mapped = Stage("map (vectorized)", MAP, vectorized_cost, parallel=True, random=any(s.random for s in maps))
    stages = (*kept[: batch_at + 1], mapped, *kept[batch_at + 1 :])
    reason = (
        f"per-element maps {ms(per_element)} per batch of {profile.batch_size}; the same maps once per batch "
        f"{ms(vectorized_cost)} → pipeline.vectorized_map=true (the examples stay the same)"
    )
    return replace(state, stages=stages, vectorized=True), {"pipeline.vectorized_map": "true"}, reason


def transfer_uint8(state: State, profile: Profile, budget: Budget):
    if state.uint8 or not profile.integer_features:
        return None
    casts = [stage for stage in state.stages if stage.name == "map (cast)"]
    stages = tuple(stage for stage in state.stages if stage not in casts)
    stages = tuple(
        replace(stage, output_bytes_per_example=stage.output_bytes_per_example / 4) if stage.kind == SOURCE else stage
        for stage in stages
    )
    saved = f"; the cast map ({ms(casts[0].cost_per_batch_s)} per batch) goes" if casts else ""
    reason = (
        "the features are integers in [0, 255]: uint8 carries them exactly, a quarter of float32's "
        f"{profile.feature_bytes_per_example:,.0f} bytes per example{saved} → pipeline.transfer_dtype=uint8"
    )
    new = replace(state, stages=stages, uint8=True, bytes_per_example=state.bytes_per_example / 4)
    return new, {"pipeline.transfer_dtype": "uint8"}, reason


def parallelize(state: State, profile: Profile, budget: Budget):
    threads = water_fill(state.stages, state.step_time_s, budget.cores)
    maps = [stage for stage in state.stages if stage.kind == MAP and stage.parallel]
    map_threads = max((threads[stage.name] for stage in maps), default=1)
    sources = [stage for stage in state.stages if stage.kind == SOURCE and stage.parallel]
    width = min(max((threads[stage.name] for stage in sources), default=1), max(profile.num_files, 1))
    if (map_threads, width) == (state.map_parallelism, state.interleave_width):
        return None
    rate = sustainable_rate(state.stages, state.step_time_s, budget.cores)
    overrides, parts = {}, []
    if map_threads != state.map_parallelism and maps:
        heaviest = max(maps, key=lambda stage: stage.cost_per_batch_s)
        overrides["pipeline.map_parallelism"] = str(map_threads)
        parts.append(
            f"{heaviest.name}: {ms(heaviest.cost_per_batch_s)} per batch on one core; {budget.cores} cores shared "
            f"with the other stages and the step ({ms(state.step_time_s)}) sustain {rate:,.1f} batches/s → "
            f"map_parallelism {map_threads}"
        )
    if width != state.interleave_width and sources:
        source = sources[0]
        overrides["pipeline.interleave.cycle_length"] = overrides["pipeline.interleave.num_parallel_calls"] = str(width)
        parts.append(
            f"{source.name}: {ms(source.cost_per_batch_s)} per batch waiting on files; {rate:,.1f} batches/s needs "
            f"{width} file(s) read at once (of {profile.num_files}) → interleave width {width}"
        )
    new = replace(state, map_parallelism=map_threads, interleave_width=width)
    return new, overrides, "; ".join(parts)


def cache(state: State, profile: Profile, budget: Budget):
    slot = cache_slot(state.stages)
    if state.cached or slot is None:
        return None
    position = cache_position(state.stages, profile.examples_per_epoch, budget.memory_bytes)
    if position != slot:  # bwopt caches in one place only; an earlier stage would save less
        return None
    check_cache_position(state.stages, position)
    held = state.stages[position].output_bytes_per_example * profile.examples_per_epoch
    saved = sum(stage.cost_per_batch_s for stage in state.stages[: position + 1])
    epochs = max(profile.epochs, 1)
    stages = tuple(
        replace(stage, cost_per_batch_s=stage.cost_per_batch_s / epochs) if index <= position else stage
        for index, stage in enumerate(state.stages)
    )
    reason = (
        f"stages up to {state.stages[position].name} are deterministic; one epoch of its output is "
        f"{held / 2**20:,.1f} MiB of a {budget.memory_bytes / 2**20:,.0f} MiB budget → pipeline.cache=memory "
        f"after it, saving {ms(saved)} per batch after the first of {epochs} epoch(s)"
    )
    return replace(state, stages=stages, cached=True), {"pipeline.cache": "memory"}, reason


def prefetch(state: State, profile: Profile, budget: Budget):
    threads = threads_of(state)
    latency = sum(stage.cost_per_batch_s / threads[stage.name] for stage in state.stages)
    period = max(producer_period_s(state.stages, threads, budget.cores), state.step_time_s)
    batch_bytes = state.bytes_per_example * profile.batch_size
    depth = prefetch_depth(latency, period, batch_bytes, budget.memory_bytes)
    if depth == state.prefetch:
        return None
    reason = (
        f"a batch takes {ms(latency)} through the stages and one is consumed every {ms(period)}: "
        f"ceil({ms(latency)} / {ms(period)}) + 1 = {depth} batches ({depth * batch_bytes / 2**20:,.1f} MiB) "
        f"in flight → prefetch {depth}"
    )
    return replace(state, prefetch=depth), {"pipeline.prefetch": str(depth)}, reason


def amortise_host(state: State, profile: Profile, budget: Budget):
    steps = steps_per_execution(profile.host_overhead_share, profile.steps_per_epoch)
    if steps <= state.steps_per_execution:
        return None
    share = profile.host_overhead_share
    # the host's fixed cost per step is paid once per call: the step time it takes shrinks by steps
    overhead = state.step_time_s * share
    new_step = state.step_time_s - overhead + overhead / steps
    reason = (
        f"host overhead (fetch, dispatch, sync) is {share:.0%} of the step → train.steps_per_execution={steps} "
        "pays it once per call (the same steps, the same math)"
    )
    new = replace(state, steps_per_execution=steps, step_time_s=new_step)
    return new, {"train.steps_per_execution": str(steps)}, reason


CANDIDATES: Tuple[Callable, ...] = (vectorize, transfer_uint8, parallelize, cache, prefetch, amortise_host)


def lower_precision(state: State, profile: Profile, budget: Budget):
    """A 16-bit policy for the step, where the device has units for it: it changes the math, so it
    is proposed only with `tune.allow: [precision]`, after every change that keeps the math."""
    if state.precision != "float32" or not profile.sixteen_bit:
        return None
    step = state.step_time_s / SIXTEEN_BIT_SPEEDUP
    reason = (
        f"{profile.sixteen_bit_reason}: the step ({ms(state.step_time_s)} per batch) at best "
        f"{ms(step)} → device.precision={profile.sixteen_bit} (changes the math: allowed by tune.allow; kept "
        "only if faster and val_accuracy within the tolerance)"
    )
    new = replace(state, precision=profile.sixteen_bit, step_time_s=step)
    return new, {"device.precision": profile.sixteen_bit}, reason


# tune.allow's names -> the candidates they let in (batch_size: none yet).
OPT_IN: Dict[str, Callable] = {"precision": lower_precision}


def initial_state(profile: Profile, start: dict) -> State:
    """The model of the start: `start` holds the knobs it ran with (map_parallelism, prefetch, ...)."""
    return State(
        stages=tuple(profile.stages),
        map_parallelism=start.get("map_parallelism", 1),
        interleave_width=start.get("interleave_width", 1),
        prefetch=start.get("prefetch", 0),
        cached=start.get("cached", False),
        vectorized=start.get("vectorized", False),
        uint8=start.get("uint8", False),
        steps_per_execution=start.get("steps_per_execution", 1),
        step_time_s=profile.step_time_s,
        bytes_per_example=profile.feature_bytes_per_example,
        precision=start.get("precision", "float32"),
    )


def candidate_name(candidate: Callable) -> str:
    return candidate.__name__.replace("_", " ")


# The proposals that change the step itself: past the target fraction of the compute ceiling they
# are still tried, since they move the ceiling.
OPT_IN_NAMES = frozenset(candidate_name(candidate) for candidate in OPT_IN.values())


def plan(
    profile: Profile, budget: Budget, start: dict, kept=(), rejected=(), allow: Sequence[str] = ()
) -> List[Proposal]:
    """The proposals, best predicted gain first, each weighed on top of those before it.

    `kept` and `rejected` name proposals already run (`Proposal.name`): the kept ones are applied
    first, in their order, and the rejected ones are left out, so after a revert the rest are
    weighed again on top of what was kept rather than of the change that did not help. `allow`
    (tune.allow) lets in changes that alter the math (`OPT_IN`): they come after every change that
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
            Proposal(name, overrides, f"{reason} (model: ×{gain:.2f})", predicted_batch_time_s(state, budget))
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
        proposals.append(Proposal(candidate_name(candidate), overrides, f"{reason} (model: ×{gain:.2f})", predicted))
    for name, candidate in opt_in.items():
        if name in (*kept, *rejected):
            continue
        current = predicted_batch_time_s(state, budget)
        outcome = candidate(state, profile, budget)
        if outcome is None or current / predicted_batch_time_s(outcome[0], budget) < MIN_PREDICTED_GAIN:
            continue
        state, overrides, reason = outcome
        predicted = predicted_batch_time_s(state, budget)
        proposals.append(Proposal(name, overrides, f"{reason} (model, at best: ×{current / predicted:.2f})", predicted))
    return proposals


# Proposals that only add overlap or threads: with every core busy they cannot make a run faster.
# The share of its cores a trial's training must keep busy, measured, for threads and overlap to be skipped.
BUSY_SHARE = 0.85
CONCURRENCY = ("parallelize", "prefetch")


def busy_cores_reason(proposal_name: str, incumbent: "Trial") -> Optional[str]:
    """Why a proposal that only adds threads or overlap is not tried on `incumbent`: every core is
    busy (at 90 % or more of its cores ceiling, below the other ceilings, and, where measured, at
    least `BUSY_SHARE` of its cores kept busy by training); None when it may help."""
    others = [value for value in (incumbent.compute_ceiling, incumbent.input_ceiling) if value]
    if proposal_name not in CONCURRENCY or not incumbent.throughput:
        return None
    if not cores_bound(incumbent.throughput, incumbent.cores_ceiling, others):
        return None
    busy, cores = incumbent.cores_busy, incumbent.cores_available
    if busy is not None and cores and busy < BUSY_SHARE * cores:  # the estimate says busy, the clock does not
        return None
    measured = "" if busy is None else f", {busy:.2f} cores busy"
    return (
        f"every core busy: trial {incumbent.number} runs at {incumbent.throughput / incumbent.cores_ceiling:.2f} "
        f"of its cores ceiling ({incumbent.cores_ceiling:,.0f} examples/s{measured}), so more threads or overlap "
        "cannot make it faster"
    )
