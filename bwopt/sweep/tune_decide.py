"""What `tune` changes next, and why: pure functions from a pipeline's per-stage costs to proposals.

The input is a `Profile`: the training pipeline's stages in order (source first), each with its
cost per batch on one core, whether it can run in parallel, whether it draws randomness, and the
size of what it outputs; beside it the consumer (the training step's time per batch, from the
compute ceiling), the cores and the memory the pipeline may use (`Budget`). No TensorFlow, no
Hydra: bwopt.sweep.tune_probe measures the costs, bwopt.sweep.tune runs the proposals.

The model (each function's docstring says its part):

- a stage that runs in parallel with p threads delivers a batch every T/p; a sequential stage
  every T; all stages and the step share the cores, so the whole pipeline delivers at most
  cores / (sum of T over CPU stages + step time x the cores it holds) batches per second
  (`sustainable_rate`): a step that spans several cores holds them for its wall time
  (bwopt.measure.ceilings.step_cores), and a pipeline that runs meanwhile delays it;
- without prefetch the step waits for the producer: a batch takes the producer's time plus the
  step's; with prefetch they overlap and a batch takes the longer of the two (`batch_time_s`);
- a cache removes, after the first epoch, every stage at or before it; it must hold one epoch of
  that stage's output and it may never follow a random stage (shuffle, augmentation, a random
  crop), which would freeze one draw for every epoch (`cache_position`).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

SOURCE, MAP, BATCH, SHUFFLE, OTHER = "source", "map", "batch", "shuffle", "other"
# Opt-in settings that change the math or the pixels (hydra.sweeper.allow): none is proposed without it.
ALLOWED_CHANGES = ("precision", "batch_size", "decode")
# What the model assumes a 16-bit policy does at best to the step: half float32's time (units that
# run 16-bit matrix products at twice the rate); the trial measures what it does.
SIXTEEN_BIT_SPEEDUP = 2.0
BFLOAT16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
MAX_PREFETCH = 16
MAX_STEPS_PER_EXECUTION = 64
HOST_OVERHEAD_SHARE = 0.2  # the verdict's threshold (bwopt.measure): above it, amortise the host's cost
HOST_SHARE_AIM = 0.05  # what amortising the host's cost aims its share at
# The most a larger batch multiplies the start's by (hydra.sweeper.allow: [batch_size]): the fewer steps an
# epoch has, the further the optimisation moves from the start's, whatever the learning-rate rule.
MAX_BATCH_SCALE = 4
# How the learning rate follows the batch (k times the examples per step): linear for SGD (Goyal et
# al. 2017, "Accurate, Large Minibatch SGD"), square root for the adaptive optimizers (Malladi et
# al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms").
LEARNING_RATE_RULES = {"sgd": ("linear", 1.0), "adam": ("square-root", 0.5), "rmsprop": ("square-root", 0.5)}
PREFETCH_MEMORY_SHARE = 0.1  # of the memory budget, for prefetched batches
MIN_PREDICTED_GAIN = 1.02  # a proposal the model expects to gain less than this is not run


class UnsafeProposal(ValueError):
    """A proposal that would change the examples (a cache after a random stage)."""


@dataclass(frozen=True)
class Stage:
    """One stage of the training pipeline as measured.

    Attributes:
        name: what it is, e.g. "map (augment)".
        kind: source, map, batch, shuffle or other.
        cost_per_batch_s: its own time per training batch on one core (its inputs' time excluded).
        parallel: whether more threads make it faster (map, interleave); else it runs on one.
        random: whether its output differs by epoch (shuffle, augmentation, random crops): no
            cache may follow it.
        output_bytes_per_example: the size of its output, per example (what a cache after it holds).
        io_bound: it mostly waits (file reads): it does not count against the cores.
    """

    name: str
    kind: str
    cost_per_batch_s: float
    parallel: bool = False
    random: bool = False
    output_bytes_per_example: float = 0.0
    io_bound: bool = False


@dataclass(frozen=True)
class Budget:
    """What the pipeline may use: cores (threads that run at once) and memory in bytes."""

    cores: int
    memory_bytes: float


@dataclass(frozen=True)
class Profile:
    """The start's pipeline and its consumer, as tune sees them.

    Attributes:
        stages: source first; per-element stages' costs already scaled to one batch.
        batch_size: examples per batch.
        examples_per_epoch: training examples in one epoch (what a cache holds).
        step_time_s: the training step alone per batch (global batch / compute ceiling).
        vectorized_map_cost_s: the per-batch cost of the maps run once on whole batches, when
            measured (None: not measured, or the maps cannot be vectorised).
        integer_features: features are integers in [0, 255]: uint8 carries them exactly.
        feature_bytes_per_example: the transferred features' size in the current dtype.
        num_files: files of a file source (interleave width is bounded by it); 0 for other sources.
        host_overhead_share: the step partition's host overhead (fetch, dispatch, sync) of the start.
        steps_per_epoch: training steps per epoch (steps_per_execution divides it).
        epochs: training epochs of a trial (a cache pays after the first).
        sixteen_bit: the 16-bit precision policy the device has units for (`sixteen_bit_precision`),
            None where it has none; `sixteen_bit_reason` says which.
        optimizer, learning_rate: the start's (a larger batch scales the rate, `scaled_learning_rate`).
        steps_per_epoch_set: the start sets train.steps_per_epoch (a larger batch then runs fewer
            of them, so that an epoch holds the same examples); else one pass sets it.
        warmup_steps: untimed steps at the start of an epoch (the larger of warm-up and epoch
            warm-up): an epoch of a larger batch must keep steps beyond them.
        device: the start's device target (cpu, gpu, tpu).
        strategy: the start's tf.distribute strategy (parameter_server runs one step per closure:
            no steps per execution).
        device_copy_s: a batch's copy from host memory to the accelerator at the bandwidth the
            probe measured; 0 where none was measured (a CPU target: nothing to copy).
        step_cores: the whole cores the step holds while it runs, measured with the start's
            ceilings (bwopt.measure.ceilings.step_cores); 1 where not measured.
        whole_decode_stages: where the start decodes only the crop windows of images cropped at
            random, the stages of the same pipeline decoding whole images, the decoding a
            deterministic stage before the shuffle (probed with hydra.sweeper.allow=[decode]); else None.
        fused_map_batch_cost_s: where a per-element map feeds the batch, the two as one op (tf.data's
            map-and-batch fusion) per batch, measured; None where not measured.
    """

    stages: Tuple[Stage, ...]
    batch_size: int
    examples_per_epoch: int
    step_time_s: float
    vectorized_map_cost_s: Optional[float] = None
    integer_features: bool = False
    feature_bytes_per_example: float = 0.0
    num_files: int = 0
    host_overhead_share: float = 0.0
    steps_per_epoch: int = 0
    epochs: int = 1
    sixteen_bit: Optional[str] = None
    sixteen_bit_reason: str = ""
    optimizer: str = "adam"
    learning_rate: float = 0.0
    steps_per_epoch_set: bool = False
    warmup_steps: int = 0
    device: str = "cpu"
    device_copy_s: float = 0.0
    strategy: str = "default"
    step_cores: int = 1
    whole_decode_stages: Optional[Tuple[Stage, ...]] = None
    fused_map_batch_cost_s: Optional[float] = None


def sixteen_bit_precision(
    device: str, cpu_flags: Sequence[str] = (), compute_capability: Optional[Sequence[int]] = None
) -> Tuple[Optional[str], str]:
    """(the Keras mixed-precision policy `device` runs 16-bit math fastest with, why), or (None, why not).

    cpu: mixed_bfloat16 where the CPU has bfloat16 instructions (`BFLOAT16_CPU_FLAGS`, as
    /proc/cpuinfo names them); elsewhere 16-bit math is emulated. gpu: mixed_bfloat16 from compute
    capability 8.0 (tensor cores with bfloat16, no loss scaling), mixed_float16 from 7.0 (tensor
    cores, with loss scaling). tpu: mixed_bfloat16.
    """
    if device == "tpu":
        return "mixed_bfloat16", "TPU cores multiply in bfloat16"
    if device == "gpu":
        if not compute_capability:
            return None, "the GPU's compute capability is unknown"
        capability = tuple(compute_capability)[:2]
        named = ".".join(map(str, capability))
        if capability >= (8, 0):
            return "mixed_bfloat16", f"the GPU (compute capability {named}) has bfloat16 tensor cores"
        if capability >= (7, 0):
            return "mixed_float16", f"the GPU (compute capability {named}) has float16 tensor cores"
        return None, f"the GPU (compute capability {named}) has no tensor cores"
    found = [flag for flag in BFLOAT16_CPU_FLAGS if flag in cpu_flags]
    if found:
        return "mixed_bfloat16", f"the CPU has bfloat16 instructions ({', '.join(found)})"
    return None, f"the CPU has no bfloat16 instructions ({', '.join(BFLOAT16_CPU_FLAGS)}): 16-bit math is emulated"


@dataclass(frozen=True)
class Proposal:
    """One change tune runs: its overrides, the reason with numbers, what the model expects."""

    name: str
    overrides: Dict[str, str]
    reason: str
    predicted_batch_time_s: float = 0.0
    gain: float = 1.0  # what the model expects it to multiply the throughput by
    parts: Tuple[str, ...] = ()  # the proposals it runs together (`tune_plan.together`); () for one


@dataclass
class Settings:
    """The pipeline knobs tune decides (what the current trial runs with)."""

    map_parallelism: int = 1
    interleave_width: int = 1
    prefetch: int = 0
    cache_after: Optional[int] = None  # index of the stage the cache follows
    vectorized: bool = False
    uint8: bool = False
    steps_per_execution: int = 1
    extra: Dict[str, str] = field(default_factory=dict)


# --- the model ---------------------------------------------------------------------------------


def cpu_time_per_batch_s(stages: Sequence[Stage]) -> float:
    return sum(stage.cost_per_batch_s for stage in stages if not stage.io_bound)


def sustainable_rate(stages: Sequence[Stage], step_time_s: float, cores: int, step_cores: int = 1) -> float:
    """Batches per second the water can rise to: every core busy on the stages and the step (which
    holds `step_cores` for its time), or a sequential stage (or the step) saturated, whichever
    comes first."""
    cpu_bound = cores / max(cpu_time_per_batch_s(stages) + step_cores * step_time_s, 1e-12)
    sequential = [stage.cost_per_batch_s for stage in stages if not stage.parallel] + [step_time_s]
    return min(cpu_bound, 1.0 / max(max(sequential), 1e-12))


def water_fill(stages: Sequence[Stage], step_time_s: float, cores: int, step_cores: int = 1) -> Dict[str, int]:
    """Threads per stage that sustain `sustainable_rate`: ceil(cost x rate) for a parallel stage,
    capped at the cores (at the files for an I/O-bound one it is the caller's cap); 1 for a
    sequential one. Giving the threads to the most loaded stage first until the cores run out ends
    at the same level: the optimum of max(T_i / p_i) under sum(T_i) x rate <= cores."""
    rate = sustainable_rate(stages, step_time_s, cores, step_cores)
    threads = {}
    for stage in stages:
        if not stage.parallel:
            threads[stage.name] = 1
            continue
        needed = math.ceil(stage.cost_per_batch_s * rate - 1e-9)
        threads[stage.name] = max(1, needed if stage.io_bound else min(cores, needed))
    return threads


def producer_period_s(stages: Sequence[Stage], threads: Dict[str, int], cores: int) -> float:
    """Seconds between batches the pipeline alone delivers with these threads."""
    slowest = max((stage.cost_per_batch_s / threads.get(stage.name, 1) for stage in stages), default=0.0)
    return max(slowest, cpu_time_per_batch_s(stages) / cores)


def batch_time_s(
    stages: Sequence[Stage], threads: Dict[str, int], step_time_s: float, cores: int, prefetch: int, step_cores: int = 1
):
    """Seconds per training batch: the producer then the step (prefetch 0), or both overlapped,
    the cores shared by the stages' CPU time and the step's held cores for its time."""
    producer = producer_period_s(stages, threads, cores)
    if prefetch == 0:
        return producer + step_time_s
    return max(producer, step_time_s, (cpu_time_per_batch_s(stages) + step_cores * step_time_s) / cores)


# --- single decisions --------------------------------------------------------------------------


def cache_position(stages: Sequence[Stage], examples_per_epoch: int, memory_bytes: float) -> Optional[int]:
    """The index of the most downstream stage a cache may follow: every stage up to it
    deterministic, and one epoch of its output within `memory_bytes`; None when there is none."""
    best = None
    for index, stage in enumerate(stages):
        if stage.random:
            break
        if stage.output_bytes_per_example * examples_per_epoch <= memory_bytes:
            best = index
    return best


def check_cache_position(stages: Sequence[Stage], position: Optional[int]) -> None:
    """Raise UnsafeProposal when a cache after stage `position` would follow a random stage."""
    if position is None:
        return
    random = [stage.name for stage in stages[: position + 1] if stage.random]
    if random:
        raise UnsafeProposal(
            f"a cache after {stages[position].name} would follow the random stage {random[0]}: every epoch "
            "would replay the first epoch's draws"
        )


def prefetch_depth(latency_s: float, consumer_period_s: float, batch_bytes: float, memory_bytes: float) -> int:
    """Batches in flight to hide the producer's latency from the consumer (Little's law: latency /
    period), plus one for its jitter; at most what `PREFETCH_MEMORY_SHARE` of the memory holds."""
    wanted = math.ceil(latency_s / max(consumer_period_s, 1e-12) - 1e-9) + 1
    fits = int(memory_bytes * PREFETCH_MEMORY_SHARE // max(batch_bytes, 1.0))
    return max(1, min(wanted, MAX_PREFETCH, fits))


def steps_per_execution(host_overhead_share: float, steps_per_epoch: int) -> int:
    """Steps per compiled call that bring the host's share below 5 %: the overhead is paid once per
    call, so N >= share / (1 - share) / 0.05 roughly; a power of two that divides the epoch."""
    if host_overhead_share < HOST_OVERHEAD_SHARE:
        return 1
    wanted = host_overhead_share / max(1.0 - host_overhead_share, 1e-3) / HOST_SHARE_AIM
    steps = 1
    while steps < min(wanted, MAX_STEPS_PER_EXECUTION) and (not steps_per_epoch or steps_per_epoch % (steps * 2) == 0):
        steps *= 2
    return steps


def batch_scale_for(host_overhead_share: float) -> int:
    """How many times the start's examples a step should take to bring the host's fixed cost per
    step below 5 % of the step (as `steps_per_execution`, the step's own time grows with the batch
    while the host's does not): a power of two up to `MAX_BATCH_SCALE`; 1 below the verdict's threshold."""
    if host_overhead_share < HOST_OVERHEAD_SHARE:
        return 1
    wanted = host_overhead_share / max(1.0 - host_overhead_share, 1e-3) / HOST_SHARE_AIM
    scale = 1
    while scale < min(wanted, MAX_BATCH_SCALE):
        scale *= 2
    return scale


def scaled_learning_rate(learning_rate: float, optimizer: str, scale: int) -> Tuple[float, str]:
    """(the learning rate for `scale` times the examples per step, the rule's name): linear for SGD,
    square root for Adam and RMSprop (`LEARNING_RATE_RULES`)."""
    rule, power = LEARNING_RATE_RULES[optimizer]
    return learning_rate * scale**power, rule
