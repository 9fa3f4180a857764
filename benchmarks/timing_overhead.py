"""What timing every step costs: bwopt's timed loop against the same loop untimed.

One tiny distributed training set-up (default strategy, a small MLP, a from_tensor_slices
dataset with prefetch, the real `bwopt.train.make_step_functions` train step) runs blocks of
`STEPS_PER_BLOCK` steps in three ways, interleaved round by round (the order alternates between
rounds, ABCCBA..., so drift in machine speed hits all three alike):

- untimed, host sync per step: `read_on_host(train_step(next(iterator)))`, exactly the read the
  timed loop's step makes; the difference to the timed loop is the loop's own cost (the timing,
  the hooks a run always has: step timer, epoch metrics, stop check);
- untimed, host sync per block: the same without the per-step reads, one read at the end of the
  block; its difference to the above is what the per-step host sync costs, which timing compute
  requires;
- timed: `bwopt.train.train` itself (the one timed loop, `bwopt.loop.timed_loop`), with the step
  timer and the stop check as hooks and no validation batches.

Each block's wall time is taken with `perf_counter` around the whole block. Printed: the median
over rounds of the per-step time of each, the timed loop's per-step overhead in microseconds and
its ratio to each untimed loop (medians of the per-round values), the cost of the timing
loop alone (the timed loop with the same hooks around steps that do nothing, 200,000 times), and how
much of the timed block's wall time the recorded step times cover.

Run: `.venv/bin/python benchmarks/timing_overhead.py` (about 20 s on 2 cores).
"""

import statistics
import time

import _common  # noqa: F401 (quiets TensorFlow's start-up chatter, as in every benchmark)
import numpy as np

NUM_EXAMPLES = 4096
NUM_FEATURES = 64
GLOBAL_BATCH = 64
STEPS_PER_BLOCK = 100
WARMUP_STEPS = 50
ROUNDS = 30


def build_training():
    """(step functions, iterator over the distributed dataset) for a small MLP on random uint8 data."""
    import keras
    import tensorflow as tf

    from bwopt.train import StepSettings, make_step_functions

    strategy = tf.distribute.get_strategy()
    rng = np.random.default_rng(0)
    features = rng.integers(0, 256, size=(NUM_EXAMPLES, NUM_FEATURES), dtype=np.uint8)
    labels = rng.integers(0, 10, size=NUM_EXAMPLES, dtype=np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat()
    dataset = dataset.batch(GLOBAL_BATCH, drop_remainder=True).prefetch(2)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((NUM_FEATURES,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    steps = make_step_functions(strategy, model, optimizer, StepSettings(GLOBAL_BATCH, 1 / 255))
    return steps, iter(strategy.experimental_distribute_dataset(dataset))


def untimed_sync_per_step(steps, iterator, timer) -> None:
    from bwopt.measure import read_on_host

    for _ in range(STEPS_PER_BLOCK):
        read_on_host(steps.train_step(next(iterator)))


def untimed_sync_per_block(steps, iterator, timer) -> None:
    from bwopt.measure import read_on_host

    for _ in range(STEPS_PER_BLOCK):
        results = steps.train_step(next(iterator))
    read_on_host(results)


def timed_like_bwopt(steps, iterator, timer) -> None:
    from bwopt.measure import StepPlan
    from bwopt.signals import StopCheck
    from bwopt.train import train

    train(steps, iterator, (), StepPlan(1, STEPS_PER_BLOCK, 0), [timer, StopCheck()])


LOOPS = {
    "untimed, sync per step": untimed_sync_per_step,
    "untimed, sync per block": untimed_sync_per_block,
    "timed (bwopt.train)": timed_like_bwopt,
}


def instrumentation_alone_us(num_steps: int = 200_000) -> float:
    """Per-step cost of the timed loop and a run's hooks around steps that do nothing."""
    import itertools

    from bwopt.loop import timed_loop
    from bwopt.measure import StepTimer
    from bwopt.signals import StopCheck

    started = time.perf_counter()
    timed_loop(itertools.repeat(None), lambda batch: None, 1, num_steps, [StepTimer(), StopCheck()])
    return (time.perf_counter() - started) / num_steps * 1e6


def block_wall_s(loop, steps, iterator, timer) -> float:
    started = time.perf_counter()
    loop(steps, iterator, timer)
    return time.perf_counter() - started


def main() -> None:
    from bwopt.measure import StepTimer

    steps, iterator = build_training()
    for _ in range(WARMUP_STEPS):  # tracing, prefetch fill
        float(steps.train_step(next(iterator))[0])
    per_step_us = {name: [] for name in LOOPS}
    coverage = []
    for round_number in range(ROUNDS):
        names = list(LOOPS) if round_number % 2 == 0 else list(reversed(LOOPS))
        for name in names:
            timer = StepTimer()
            wall_s = block_wall_s(LOOPS[name], steps, iterator, timer)
            per_step_us[name].append(wall_s / STEPS_PER_BLOCK * 1e6)
            if timer.num_steps:
                coverage.append((sum(timer.input_wait_s) + sum(timer.compute_s)) / wall_s)
    report(per_step_us, coverage, instrumentation_alone_us())


def report(per_step_us, coverage, instrumentation_us: float) -> None:
    timed = per_step_us["timed (bwopt.train)"]
    print(f"{ROUNDS} rounds x {STEPS_PER_BLOCK} steps, global batch {GLOBAL_BATCH}, default strategy, TF on CPU")
    for name, values in per_step_us.items():
        median = statistics.median(values)
        print(f"  {name:<26} median {median:8.1f} us/step  (min {min(values):.1f}, max {max(values):.1f})")
    for baseline in ("untimed, sync per step", "untimed, sync per block"):
        untimed = per_step_us[baseline]
        overhead_us = statistics.median(t - u for t, u in zip(timed, untimed))
        ratio = statistics.median(t / u for t, u in zip(timed, untimed))
        print(f"  timed vs {baseline:<24} overhead {overhead_us:+7.1f} us/step  ratio {ratio:.3f}")
    print(f"  the timed loop and its hooks alone (steps that do nothing) cost {instrumentation_us:.2f} us/step")
    print(f"  recorded step times cover {statistics.median(coverage):.2%} of the timed blocks' wall time (median)")


if __name__ == "__main__":
    main()
