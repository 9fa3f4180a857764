"""The changes `tune` makes only where hydra.sweeper.allow names them: they change the math or the pixels.

Candidates on the cost model's `State` (bwopt.sweep.tune_changes), weighed after every change that
keeps the examples and the math, in hydra.sweeper.allow's order: a 16-bit precision (`precision`), a larger
batch with its learning rate scaled (`batch_size`) and JPEGs decoded whole into a cache instead of
only their random crop windows (`decode`). Each is kept only when faster and its val_accuracy is
within the tolerance of the start's. Pure: no TensorFlow, no Hydra.
"""

from dataclasses import replace
from typing import Callable, Dict

from bwopt.sweep.tune_changes import State, cache, fuse_stages, host_share, ms
from bwopt.sweep.tune_decide import (
    LEARNING_RATE_RULES,
    PREFETCH_MEMORY_SHARE,
    SIXTEEN_BIT_SPEEDUP,
    Budget,
    Profile,
    batch_scale_for,
    scaled_learning_rate,
)


def lower_precision(state: State, profile: Profile, budget: Budget):
    """A 16-bit policy for the step, where the device has units for it: it changes the math, so it
    is proposed only with `hydra.sweeper.allow: [precision]`, after every change that keeps the math."""
    if state.precision != "float32" or not profile.sixteen_bit:
        return None
    step = state.host_overhead_s + (state.step_time_s - state.host_overhead_s) / SIXTEEN_BIT_SPEEDUP
    reason = (
        f"{profile.sixteen_bit_reason}: the step ({ms(state.step_time_s)} per batch) at best "
        f"{ms(step)} → device.precision={profile.sixteen_bit} (changes the math: allowed by hydra.sweeper.allow; kept "
        "only if faster and val_accuracy within the tolerance)"
    )
    new = replace(state, precision=profile.sixteen_bit, step_time_s=step)
    return new, {"device.precision": profile.sixteen_bit}, reason


def enlarge_batch(state: State, profile: Profile, budget: Budget):
    """A larger global batch, where the host's fixed cost per step is a share of the step that the
    batch amortises (`batch_scale_for`); the learning rate follows its optimizer's rule and, where the
    start sets train.steps_per_epoch, an epoch runs fewer steps of the same examples. Only with
    `hydra.sweeper.allow: [batch_size]`: the model then takes fewer, larger steps. Not proposed when an epoch
    would keep no step beyond its warm-up, or would not be whole executions of
    train.steps_per_execution; the model counts only the host's share, not what a fuller device gains."""
    if state.batch_scale != 1 or not profile.learning_rate or profile.optimizer not in LEARNING_RATE_RULES:
        return None
    share = host_share(state)
    scale = batch_scale_for(share)
    while scale > 1 and not batch_fits(state, profile, budget, scale):
        scale //= 2
    if scale == 1:
        return None
    batch = profile.batch_size * scale
    rate, rule = scaled_learning_rate(profile.learning_rate, profile.optimizer, scale)
    steps = profile.steps_per_epoch // scale
    overrides = {"train.global_batch_size": str(batch), "train.learning_rate": f"{rate:.6g}"}
    if profile.steps_per_epoch_set:
        overrides["train.steps_per_epoch"] = str(steps)
    compute = state.step_time_s - state.host_overhead_s
    stages = tuple(replace(stage, cost_per_batch_s=stage.cost_per_batch_s * scale) for stage in state.stages)
    new = replace(state, stages=stages, batch_scale=scale, step_time_s=state.host_overhead_s + compute * scale)
    reason = (
        f"host overhead (fetch, dispatch, sync) is {share:.0%} of the step, paid once per step → "
        f"train.global_batch_size={batch} ({scale}× the examples per step, {steps} steps per epoch; the model "
        "counts only the host's share), "
        f"train.learning_rate={rate:.6g} ({profile.optimizer}: the {rule} rule) (changes the math: allowed by "
        "hydra.sweeper.allow; kept only if faster and val_accuracy within the tolerance)"
    )
    return new, overrides, reason


def batch_fits(state: State, profile: Profile, budget: Budget, scale: int) -> bool:
    """`scale` times the batch leaves every epoch steps beyond its warm-up, whole executions of
    train.steps_per_execution where the start sets the epoch's steps, and prefetched batches in
    their share of the memory."""
    steps = profile.steps_per_epoch // scale
    if profile.steps_per_epoch_set and (profile.steps_per_epoch % scale or steps % state.steps_per_execution):
        return False
    per_call = state.steps_per_execution
    timed_calls = steps // per_call - -(-profile.warmup_steps // per_call)  # as bwopt.inputs.step_plan counts
    in_flight = max(state.prefetch, 1) * state.bytes_per_example * profile.batch_size * scale
    return timed_calls > 0 and in_flight <= budget.memory_bytes * PREFETCH_MEMORY_SHARE


def decode_whole(state: State, profile: Profile, budget: Budget):
    """JPEGs decoded whole, before the shuffle, into a cache, where the start decodes only each
    random crop window (`fused_decode_crop: true`): a random decode leaves nothing decoded to
    cache. The cropped pixels may move by up to two levels (libjpeg decodes a window's edges from
    other neighbours), so it is proposed only with `hydra.sweeper.allow: [decode]`, and only with a cache
    of the decoded images within the memory budget: decoding whole images every epoch costs
    more than decoding crop windows. The stages are the probe's of that pipeline (`Profile.whole_decode_stages`)."""
    if state.whole_decoded or state.vectorized or not profile.whole_decode_stages:
        return None
    scale = state.batch_scale
    stages = tuple(
        replace(stage, cost_per_batch_s=stage.cost_per_batch_s * scale) for stage in profile.whole_decode_stages
    )
    if state.fused:  # kept before: the crops' map and the batch as one op (its saving not measured here)
        stages = fuse_stages(stages) or stages
    outcome = cache(replace(state, stages=stages, cached=False, whole_decoded=True), profile, budget)
    if outcome is None:
        return None
    new, cached, reason = outcome
    decode = next((stage for stage in stages if stage.name == "map (decode)"), None)
    decoding = f" ({ms(decode.cost_per_batch_s)} per batch, measured)" if decode else ""
    reason = (
        f"decoding only each random crop window leaves nothing decoded to cache; decoding whole images{decoding} "
        f"is deterministic, before the shuffle → pipeline.fused_decode_crop=false: {reason} (moves cropped "
        "pixels by up to two levels: allowed by hydra.sweeper.allow; kept only if faster and val_accuracy within "
        "the tolerance)"
    )
    return new, {"pipeline.fused_decode_crop": "false", **cached}, reason


# hydra.sweeper.allow's names -> the candidates they let in (weighed in hydra.sweeper.allow's order).
OPT_IN: Dict[str, Callable] = {"precision": lower_precision, "batch_size": enlarge_batch, "decode": decode_whole}
