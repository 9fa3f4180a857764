"""The changes `tune` can make, each a candidate on the cost model's `State` of the pipeline.

A candidate takes the state the changes before it leave, the start's `Profile` and the `Budget`
and returns (the state after it, its overrides, a one-line reason with the numbers it came from),
or None when it does not apply. `CANDIDATES` keep the examples and the math (vectorised maps, a
lossless transfer dtype, parallelism by water-filling, a cache, prefetch depth, the map and the
batch fused into one op, steps per execution, batches fetched to an accelerator); those that
change the math or the pixels are bwopt.sweep.tune_opt_in's. Pure: no TensorFlow, no Hydra
(bwopt.sweep.tune_decide holds the model, bwopt.sweep.tune_plan the order).
"""

from dataclasses import dataclass, replace
from typing import Callable, Optional, Tuple

from bwopt.sweep.tune_decide import (
    BATCH,
    MAP,
    SHUFFLE,
    SOURCE,
    Budget,
    Profile,
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


@dataclass(frozen=True)
class State:
    """The model of the pipeline as the proposals taken so far leave it: stage costs and the step
    time are per batch as it now is, `batch_scale` times the start's; `host_overhead_s` is the
    host's fixed cost in each step (fetch, dispatch, sync), which no batch size or precision changes."""

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
    batch_scale: int = 1
    host_overhead_s: float = 0.0
    fetched: bool = True
    step_cores: int = 1
    whole_decoded: bool = False
    fused: bool = False


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
    """Seconds per batch of the start's size (so that states with other batch sizes compare)."""
    ahead = max(state.prefetch, 1 if state.fused else 0)  # a fused map and batch works one batch ahead
    per_batch = batch_time_s(state.stages, threads_of(state), state.step_time_s, budget.cores, ahead, state.step_cores)
    return per_batch / state.batch_scale


def steps_per_epoch_of(state: State, profile: Profile) -> int:
    return profile.steps_per_epoch // state.batch_scale


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


FUSED = "map and batch (fused)"  # the stage a fused map and batch make (`fuse_stages`)


def cache_slot(stages) -> Optional[int]:
    """Where bwopt's pipeline caches: after the last stage before the shuffle (bwopt.pipeline)."""
    for index, stage in enumerate(stages):
        if stage.kind in (SHUFFLE, BATCH) or stage.name == FUSED:
            return index - 1 if index else None
    return None


def fuse_stages(stages, fused_cost_s: Optional[float] = None):
    """`stages` with the per-element map that feeds the batch and the batch as one stage (`FUSED`)
    costing `fused_cost_s` per batch (measured), or their sum where not measured; None where no
    map feeds the batch."""
    at = next((i for i in range(len(stages) - 1) if stages[i].kind == MAP and stages[i + 1].kind == BATCH), None)
    if at is None:
        return None
    mapped, batched = stages[at], stages[at + 1]
    cost = mapped.cost_per_batch_s + batched.cost_per_batch_s if fused_cost_s is None else fused_cost_s
    fused = Stage(FUSED, MAP, cost, mapped.parallel, mapped.random or batched.random, batched.output_bytes_per_example)
    return (*stages[:at], fused, *stages[at + 2 :])


# --- candidates: each returns (new state, proposal) or None -------------------------------------


def vectorize(state: State, profile: Profile, budget: Budget):
    maps = [stage for stage in state.stages if stage.kind == MAP]
    if state.vectorized or state.fused or profile.vectorized_map_cost_s is None or not maps:
        return None
    per_element = sum(stage.cost_per_batch_s for stage in maps)
    vectorized_cost = profile.vectorized_map_cost_s * state.batch_scale
    kept = [stage for stage in state.stages if stage.kind != MAP]
    batch_at = next((index for index, stage in enumerate(kept) if stage.kind == BATCH), len(kept) - 1)
    mapped = Stage("map (vectorized)", MAP, vectorized_cost, parallel=True, random=any(s.random for s in maps))
    stages = (*kept[: batch_at + 1], mapped, *kept[batch_at + 1 :])
    reason = (
        f"per-element maps {ms(per_element)} per batch of {profile.batch_size * state.batch_scale}; the same maps "
        f"once per batch {ms(vectorized_cost)} → pipeline.vectorized_map=true (the examples stay the same)"
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
    threads = water_fill(state.stages, state.step_time_s, budget.cores, state.step_cores)
    maps = [stage for stage in state.stages if stage.kind == MAP and stage.parallel]
    map_threads = max((threads[stage.name] for stage in maps), default=1)
    sources = [stage for stage in state.stages if stage.kind == SOURCE and stage.parallel]
    width = min(max((threads[stage.name] for stage in sources), default=1), max(profile.num_files, 1))
    if (map_threads, width) == (state.map_parallelism, state.interleave_width):
        return None
    rate = sustainable_rate(state.stages, state.step_time_s, budget.cores, state.step_cores)
    held = f", holding {state.step_cores} cores" if state.step_cores > 1 else ""
    overrides, parts = {}, []
    if map_threads != state.map_parallelism and maps:
        heaviest = max(maps, key=lambda stage: stage.cost_per_batch_s)
        overrides["pipeline.map_parallelism"] = str(map_threads)
        parts.append(
            f"{heaviest.name}: {ms(heaviest.cost_per_batch_s)} per batch on one core; {budget.cores} cores shared "
            f"with the other stages and the step ({ms(state.step_time_s)}{held}) sustain {rate:,.1f} batches/s → "
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
    batch_bytes = state.bytes_per_example * profile.batch_size * state.batch_scale
    depth = prefetch_depth(latency, period, batch_bytes, budget.memory_bytes)
    if depth == state.prefetch:
        return None
    reason = (
        f"a batch takes {ms(latency)} through the stages and one is consumed every {ms(period)}: "
        f"ceil({ms(latency)} / {ms(period)}) + 1 = {depth} batches ({depth * batch_bytes / 2**20:,.1f} MiB) "
        f"in flight → prefetch {depth}"
    )
    return replace(state, prefetch=depth), {"pipeline.prefetch": str(depth)}, reason


def fuse(state: State, profile: Profile, budget: Budget):
    """tf.data's map-and-batch fusion, where the start turns it off (`pipeline.options`) and a
    per-element map feeds the batch: one op runs the map and writes each element into its batch as
    it is made, on a thread of its own, a batch ahead of its consumer (as a prefetch of one). The
    fused op's cost per batch is the probe's, measured in a window of its own. Not on a state whose
    maps run on whole batches (nothing to fuse), nor vectorised after it (the model would have to
    take the fused stage apart again)."""
    if state.fused or state.vectorized or profile.fused_map_batch_cost_s is None:
        return None
    fused_cost = profile.fused_map_batch_cost_s * state.batch_scale
    stages = fuse_stages(state.stages, fused_cost)
    if stages is None:
        return None
    at = next(i for i, stage in enumerate(stages) if stage.name == FUSED)
    mapped, batched = state.stages[at], state.stages[at + 1]
    reason = (
        f"{mapped.name} {ms(mapped.cost_per_batch_s)} then batch {ms(batched.cost_per_batch_s)} per batch, two ops "
        f"(tf.data's map-and-batch fusion is off); as one op {ms(fused_cost)} per batch, measured, each element "
        "written into its batch as it is made, one batch ahead of the step → "
        "pipeline.options.map_and_batch_fusion=true (the same examples: the fused op keeps the pipeline's order)"
    )
    return replace(state, stages=stages, fused=True), {"pipeline.options.map_and_batch_fusion": "true"}, reason


def host_share(state: State) -> float:
    return state.host_overhead_s / state.step_time_s if state.step_time_s else 0.0


def amortise_host(state: State, profile: Profile, budget: Budget):
    if profile.strategy == "parameter_server":  # one step per scheduled closure (bwopt.coordinated)
        return None
    share = host_share(state)
    steps = steps_per_execution(share, steps_per_epoch_of(state, profile))
    if steps <= state.steps_per_execution:
        return None
    # the host's fixed cost per step is paid once per call: the step time it takes shrinks by steps
    overhead = state.host_overhead_s / steps
    new_step = state.step_time_s - state.host_overhead_s + overhead
    reason = (
        f"host overhead (fetch, dispatch, sync) is {share:.0%} of the step → train.steps_per_execution={steps} "
        "pays it once per call (the same steps, the same math)"
    )
    new = replace(state, steps_per_execution=steps, step_time_s=new_step, host_overhead_s=overhead)
    return new, {"train.steps_per_execution": str(steps)}, reason


def fetch_to_device(state: State, profile: Profile, budget: Budget):
    """On an accelerator whose batches arrive in host memory (`pipeline.distribute.fetch_to_device`
    false), each step starts with its batch's copy; fetched, the copy of the next batch runs while
    this one trains (tf.distribute.InputOptions) on the copy engine, not a core."""
    if state.fetched or profile.device == "cpu" or not profile.device_copy_s:
        return None
    copy = profile.device_copy_s * state.batch_scale
    batch_bytes = state.bytes_per_example * profile.batch_size * state.batch_scale
    reason = (
        f"batches of {batch_bytes / 2**20:,.1f} MiB arrive in host memory and each step first copies its own to "
        f"the {profile.device.upper()} ({ms(copy)} at the bandwidth measured) → "
        "pipeline.distribute.fetch_to_device=true copies the next batch while this one trains (the same examples, "
        "the same math)"
    )
    # the distributed iterator's buffer on the device (per_replica_buffer_size) overlaps the copy
    # with the step before, so it bounds the step only where it takes longer than the step's compute
    new = replace(state, fetched=True, step_time_s=max(state.step_time_s - copy, copy))
    return new, {"pipeline.distribute.fetch_to_device": "true"}, reason


CANDIDATES: Tuple[Callable, ...] = (
    vectorize,
    transfer_uint8,
    parallelize,
    cache,
    prefetch,
    fuse,
    amortise_host,
    fetch_to_device,
)


def initial_state(profile: Profile, start: dict) -> State:
    """The model of the start: `start` holds the knobs it ran with (map_parallelism, prefetch, ...).
    The step is the compute ceiling's, which times batches already on the device: where they arrive
    in host memory (`fetch_to_device` false) each step also copies its own."""
    fetched = start.get("fetch_to_device", True)
    return State(
        stages=tuple(profile.stages),
        map_parallelism=start.get("map_parallelism", 1),
        interleave_width=start.get("interleave_width", 1),
        prefetch=start.get("prefetch", 0),
        cached=start.get("cached", False),
        vectorized=start.get("vectorized", False),
        uint8=start.get("uint8", False),
        steps_per_execution=start.get("steps_per_execution", 1),
        step_time_s=profile.step_time_s + (0.0 if fetched else profile.device_copy_s),
        bytes_per_example=profile.feature_bytes_per_example,
        precision=start.get("precision", "float32"),
        host_overhead_s=profile.step_time_s * profile.host_overhead_share,
        fetched=fetched,
        step_cores=max(profile.step_cores, 1),
        fused=start.get("fused", False),
    )


def candidate_name(candidate: Callable) -> str:
    return candidate.__name__.replace("_", " ")
