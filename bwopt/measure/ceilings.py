"""Throughput ceilings: the train step alone and the input pipeline alone.

Training cannot run faster than either part on its own, so the lower ceiling is what a perfect
overlap of input and compute would reach (see `bwopt.measure.efficiency`). Both ceilings time
`num_steps` steps back to back on the host's monotonic clock after `warmup_steps` untimed ones
(tracing, autotuning, buffer fill), and divide the examples of the timed steps by their wall time.

On a host whose cores run both the step and the pipeline (training on the CPU), a third bound
holds: the cores ceiling, cores / (CPU-seconds per example of the step + of the pipeline), each
read as process CPU time over the timed steps of its own ceiling (`CpuClock`). Training that keeps
every core busy reaches it, however well input and compute overlap. It is an estimate from each
side apart: training has measured 0.93-1.10 of it on `experiment=pipelines` with parallel maps on
2 cores, while its own CPU per example (`TimingFigures.cpu_s_per_example`, measured over its
timed steps) read 1.00 of the two sides' sum there. A step that spans several cores (its ops split
over the intra-op threads) holds them for its wall time: it costs the larger of its CPU time and
those whole cores for that time (`step_cores`). MobileNetV2 (`experiment=imagenet_like`) keeps 1.74
of 2 cores busy alone; the pipeline settings tried there averaged 0.93-0.99 of the ceiling so
counted, while its CPU time alone would put the ceiling 13 % higher.
"""

import itertools
import time
from typing import Callable, Iterable, Optional, Sequence, Tuple

import numpy as np

from bwopt.loop import Hook, timed_loop
from bwopt.measure.timing import StepPlan, StepTimer, timing_figures


class CpuClock(Hook):
    """The process's CPU time, every thread's (the step's, the pipeline's), from the start of step
    `first` to the end of step `last` of a loop: `cpu_s`, None until step `last` has ended."""

    follows_extra_steps = True

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.started: float = 0.0
        self.cpu_s = None

    def on_step_begin(self, step: int) -> None:
        if step == self.first:
            self.started = time.process_time()

    def on_step_end(self, step: int, record) -> None:
        if step == self.last:
            self.cpu_s = time.process_time() - self.started


def step_cores(cores: float, compute_cpu_s_per_example: float, compute_s_per_example: float) -> int:
    """The whole cores the train step holds while it runs: the cores it keeps busy alone (its CPU
    time over its wall time), rounded to whole cores, 1 to `cores`.

    A step whose ops split their work over the intra-op threads waits at each op for its slowest
    share: whatever else runs on one of those cores meanwhile (the input pipeline) delays the whole
    step, so the cores it spans are held for its wall time even where they idle between its ops.
    """
    busy = compute_cpu_s_per_example / max(compute_s_per_example, 1e-12)
    return int(min(max(1, round(busy)), max(1, int(cores))))


def cores_ceiling(
    cores: float,
    compute_cpu_s_per_example: float,
    input_cpu_s_per_example: float,
    compute_s_per_example: Optional[float] = None,
) -> float:
    """Examples/s that `cores` cores sustain when every example costs the step's and the pipeline's
    CPU time together: cores / (step + input CPU-seconds per example). With the step's wall time
    per example (`compute_s_per_example`, 1 / the compute ceiling) a step that spans several cores
    costs the larger of its CPU time and those whole cores (`step_cores`) for that wall time; one
    on a single core costs its CPU time (a step that waits, on an accelerator, holds none)."""
    step = compute_cpu_s_per_example
    if compute_s_per_example:
        held = step_cores(cores, compute_cpu_s_per_example, compute_s_per_example)
        if held > 1:
            step = max(step, held * compute_s_per_example)
    return cores / max(step + input_cpu_s_per_example, 1e-12)


def compute_ceiling(
    train_step: Callable,
    distributed_batch,
    num_steps: int,
    warmup_steps: int,
    examples_per_step: int,
    hooks: Sequence[Hook] = (),
    read: bool = True,
) -> float:
    """Examples/s of the compiled distributed train step alone, with no input wait.

    Timed: the compute part of `num_steps` steps of the timed loop (`bwopt.loop`) that calls
    `train_step(distributed_batch)` on the same batch, one already on the replicas' devices, each
    call synchronised like training steps are: by reading all its results on the host (`read`),
    or, where a call returns only when its work is done, by the call itself; the
    ceiling is their examples / the sum of their compute times, so no `next()` is timed.
    Excluded: the `warmup_steps` calls before (tracing, XLA compilation). `hooks` (a stop check)
    run between steps, outside the timed part.

    The step is the real one, so each call applies an optimizer update: measure on a model whose
    weights may change (after training, or a copy), never in the middle of a measured run.
    """
    timer = StepTimer()
    plan = StepPlan(1, warmup_steps + num_steps, warmup_steps)
    timed_loop(
        itertools.repeat(distributed_batch),
        (lambda batch: read_on_host(train_step(batch))) if read else train_step,
        1,
        plan.num_steps,
        [timer, *hooks],
    )
    compute_s = np.asarray(timer.compute_s)[plan.timed()]
    return num_steps * examples_per_step / float(compute_s.sum())


def input_ceiling(
    distributed_dataset_or_iterator: Iterable,
    num_steps: int,
    warmup_steps: int,
    examples_per_step: int,
    bytes_per_step: int,
    hooks: Sequence[Hook] = (),
) -> Tuple[float, float]:
    """(examples/s, bytes/s) of the distributed input pipeline alone, no training.

    Timed: `num_steps` steps of the timed loop (`bwopt.loop`) whose step is `wait_for_batch`,
    which waits until every per-replica tensor is really there (on a GPU, `next()` may return
    before the copy to the device has finished) without copying the batch back: about a
    microsecond per tensor on a CPU device, two small eager ops per tensor and replica on a GPU
    or TPU, included in the time. Excluded: the `warmup_steps` batches before (autotuning,
    prefetch and cache fill). `bytes_per_step` is the bytes of one global batch as transferred,
    features plus labels. `hooks` (a stop check) run between steps, outside the timed part.

    Raises:
        ValueError: when the dataset ends before `warmup_steps + num_steps` batches.
    """
    timer = StepTimer()
    plan = StepPlan(1, warmup_steps + num_steps, warmup_steps)
    try:
        timed_loop(iter(distributed_dataset_or_iterator), wait_for_batch, 1, plan.num_steps, [timer, *hooks])
    except StopIteration:
        raise ValueError(
            f"the dataset ended before the {plan.num_steps} batches the input ceiling needs; repeat it"
        ) from None
    figures = timing_figures(timer, plan, examples_per_step, bytes_per_step)
    return figures.throughput_examples_per_s, figures.throughput_bytes_per_s


def wait_for_batch(batch) -> None:
    """Wait until every tensor of a batch (per-replica values expanded) is materialised.

    A tensor on a CPU device is viewed as a NumPy array (no copy); on a GPU or TPU one element
    is sliced on that device and read on the host, so the batch is not copied back.
    """
    import tensorflow as tf

    for tensor in tf.nest.flatten(batch, expand_composites=True):
        if tf.DeviceSpec.from_string(tensor.device).device_type == "CPU":
            np.asarray(tensor)  # a view of the buffer, no copy, once the tensor is ready
            continue
        # Slice where the tensor lives (elsewhere it would be copied whole first), read one element.
        with tf.device(tensor.device):
            np.asarray(tf.reshape(tensor, [-1])[:1])


def read_on_host(results) -> list:
    """Every result tensor (per-replica ones expanded) as host values, which waits for the step."""
    import tensorflow as tf

    return [np.asarray(tensor) for tensor in tf.nest.flatten(results, expand_composites=True)]
