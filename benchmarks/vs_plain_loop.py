"""What bwopt's timed loop costs: bwopt's loop against the loop a user would write instead, on the
identical workload and pipeline.

Workloads (`--workload`, several at once, comma-separated; `all` for every one), each on
scikit-learn's digits (8x8x1), the default optimizer, default strategy, CPU:

- `mlp512`: MLP 512-512 (conf/model/mlp.yaml with hidden_units [512, 512]), global batch 256;
- `mlp128`: bwopt's default MLP of 128 units, batch 64: a short step, where the host's work
  per step weighs most;
- `cnn`: bwopt's small CNN (conf/model/cnn.yaml, filters 16, 32), batch 128.

Each side is built once and then trains blocks of `STEPS` steps, wall clock around each block,
after a warm-up block and a pause of `SETTLE_S` in which every pipeline refills its buffers (else
the side before would refill its own on the cores the timed side needs); the sides alternate
block by block (in `_common.alternate`'s order), so that a change in the machine's load falls
on every side alike, over `--rounds` rounds:

- `bwopt`: `bwopt.train.train` (the timed loop of every bwopt run: `next()` and the step
  timed apart, the step timer, the epoch metrics and the NaN check as hooks; on a CPU the
  step's results stay tensors until the hooks read them, 16 steps at a time) over bwopt's
  `pipeline=default` dataset;
- `bwopt spe=8`: the same with `train.steps_per_execution=8`;
- `plain loop, same figures`: a hand-written `tf.function` train step over the same
  `pipeline=default` dataset that returns what bwopt's epoch log sums (loss, correct
  predictions, examples, one vector), read once at the end of the block (it keeps only the
  last step's: a loop that added them up would pay more);
- `plain loop, same figures, concrete`: the same, calling its step's concrete function, as bwopt
  calls its own steps (`bwopt.train.DirectCall`): the observer's own cost, apart from the cheaper
  dispatch;
- `plain loop`: the same step returning only its loss: what training accuracy costs besides;
- `plain loop, plain pipeline`: that loop over `from_tensor_slices -> shuffle(1024) ->
  batch -> prefetch(AUTOTUNE)`: the pipeline alone compared, loop held fixed.

Printed, per workload: examples/s of each and the per-round ratios as `_common.spread` gives
them (geometric mean, its 95 % interval, median, min-max); a target is met only when the interval
clears it. Targets: bwopt / plain loop, same figures >= 0.98 (the observer costs at most 2 %; the same
figures, since a loop that reports training accuracy computes it); bwopt / plain loop (loss
only) printed beside it; plain loop over bwopt's pipeline / over the plain one >= 1.0.

Then, per workload, **paired steps** (`--pairs`, 0 to skip): the rounds above are blocks of 48
steps a few hundred ms apart, and the load of a shared machine moves between them (rounds read
±4 % on MLP 128, more than the 2 % under test). Here bwopt and one plain loop take turns step
by step (the same-figures loop, then the loss-only one): bwopt's timed loop runs as in every
run with one more hook last, which runs one step of the plain loop over its own model and
`pipeline=default` iterator, before each bwopt step in odd blocks and after it in even ones,
the clock read around it. Between two plain steps lies exactly one bwopt step with all its
loop's work; the first plain step of a block (cold from the pause) and the bwopt step before it
are left out. On a CPU a `tf.function` call returns when its work is done (checked: a 1.3 s
call, then 0.03 ms to read its result), so the plain step needs no read; it reads its result
once per block, as above. Per block, bwopt / plain loop = plain seconds / bwopt seconds; printed
as the median over blocks with its 95 % interval. The same alternation of a plain loop against a
second plain loop (both driven by hand) read 1.000 (0.993-1.009).

Run: `.venv/bin/python benchmarks/vs_plain_loop.py` (every workload; about 5 min each on 2
cores at 150 rounds, plus the pairs); `BWOPT_BENCHMARK_SMOKE=1` runs one short round and two
blocks of pairs (the smoke test).
"""

import argparse
import os
import time

import numpy as np
from _common import SMOKE, alternate, compose, configure_devices, load_line, ratios, spread, verdict

ROUNDS = 1 if SMOKE else int(os.environ.get("BWOPT_BENCHMARK_ROUNDS", "150"))
PAIR_BLOCKS = 2 if SMOKE else 200  # blocks of STEPS step pairs
STEPS = 16 if SMOKE else 48  # per block, a multiple of 8: short blocks, many rounds, a tight interval
SEED = 0
SETTLE_S = 0.05  # before each block: every pipeline's buffers full, its threads idle
# name -> (what it is, its overrides of conf/, global batch)
WORKLOADS = {
    "mlp512": ("MLP 512-512", ["model.hidden_units=[512,512]"], 256),
    "mlp128": ("MLP 128 (the default model)", [], 64),
    "cnn": ("CNN 16-32", ["model=cnn"], 128),
}
# (numerator, denominator, target or None: printed only); the observer's cost is the first
COMPARISONS = (
    ("bwopt", "plain loop, same figures", 0.98),
    ("bwopt", "plain loop", None),
    ("bwopt", "plain loop, same figures, concrete", None),
    ("bwopt spe=8", "plain loop, same figures", 0.98),
    ("plain loop", "plain loop, plain pipeline", 1.0),
)
# bwopt against each, step by step
PAIRED = (("plain loop, same figures", 0.98), ("plain loop", None), ("plain loop, same figures, concrete", None))


def build_sides(config):
    """name -> a block: a callable that trains `num_steps` steps on its own model and iterator."""
    import keras
    import tensorflow as tf

    from bwopt.data.sources import load_digits
    from bwopt.measure import StepPlan, StepTimer
    from bwopt.models import build_model, build_optimizer
    from bwopt.pipeline import array_elements, build_dataset
    from bwopt.train import StepSettings, TerminateOnNaN, make_step_functions, train

    source = load_digits()
    strategy = tf.distribute.get_strategy()
    batch = config.train.global_batch_size

    def bwopt_pipeline():
        elements = array_elements(source.features, source.labels)
        return build_dataset(config.pipeline, elements, batch, training=True, seed=SEED, value_range=source.value_range)

    def plain_pipeline():
        plain = tf.data.Dataset.from_tensor_slices((source.features.astype("float32"), source.labels))
        return plain.shuffle(1024, seed=SEED).repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    def model_and_optimizer():
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            model = build_model(config.model, source.feature_shape, source.num_classes)
            optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
            optimizer.build(model.trainable_variables)
        return model, optimizer

    def bwopt_side(per_execution: int):
        model, optimizer = model_and_optimizer()
        settings = StepSettings(batch, source.feature_scale, steps_per_execution=per_execution)
        steps = make_step_functions(strategy, model, optimizer, settings)
        iterator = iter(strategy.experimental_distribute_dataset(bwopt_pipeline()))

        def block(num_steps: int, extra_hooks=()) -> None:
            plan = StepPlan(1, num_steps // per_execution, 0, steps_per_execution=per_execution)
            train(steps, iterator, (), plan, [StepTimer(), TerminateOnNaN(), *extra_hooks])

        return block

    def plain_side(dataset, figures: bool = False, concrete: bool = False):
        """One step of the hand-written loop at a time, and blocks of them; with `figures`, each step
        also returns what bwopt's epoch log sums (loss, correct predictions, examples), else the loss;
        with `concrete`, the step is called through its concrete function, as bwopt calls its own."""
        model, optimizer = model_and_optimizer()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(tf.cast(x, tf.float32) * source.feature_scale, training=True)
                loss = loss_fn(y, logits)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            if not figures:
                return loss
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=y.dtype), y), tf.float32))
            return tf.stack([loss * batch, correct, float(batch)])

        iterator = iter(dataset)
        call = step.get_concrete_function(*next(iterator)) if concrete else step

        def one_step():
            return call(*next(iterator))

        def block(num_steps: int) -> None:
            for _ in range(num_steps):
                loss = one_step()
            np.asarray(loss)

        block.one_step = one_step
        return block

    return {
        "bwopt": bwopt_side(1),
        "bwopt spe=8": bwopt_side(8),
        "plain loop, same figures": plain_side(bwopt_pipeline(), figures=True),
        "plain loop, same figures, concrete": plain_side(bwopt_pipeline(), figures=True, concrete=True),
        "plain loop": plain_side(bwopt_pipeline()),
        "plain loop, plain pipeline": plain_side(plain_pipeline()),
    }


def paired_steps(bwopt_block, plain_block, blocks: int) -> list:
    """bwopt / plain loop per block of STEPS step pairs, the sides taking turns step by step
    (module docstring): plain seconds / bwopt seconds of each block."""
    from bwopt.loop import Hook

    class TakingTurns(Hook):
        """Last of bwopt's hooks: one plain step before each bwopt step (`plain_first`) or after it,
        the clock read around it. Between two plain steps lies exactly one bwopt step with all the
        loop's work; the first plain step of a block, cold from the pause, and the bwopt step
        before it are left out."""

        def __init__(self, plain_first: bool) -> None:
            self.plain_first = plain_first
            self.bwopt_s = self.plain_s = 0.0
            self.last_end = None
            self.loss = None

        def plain_step(self) -> None:
            started = time.perf_counter()
            self.loss = plain_block.one_step()
            ended = time.perf_counter()
            if self.last_end is not None:
                self.bwopt_s += started - self.last_end
                self.plain_s += ended - started
            self.last_end = ended

        def on_step_begin(self, step: int) -> None:
            if self.plain_first:
                self.plain_step()

        def on_step_end(self, step: int, record) -> None:
            if not self.plain_first:
                self.plain_step()

    per_block = []
    for number in range(blocks):
        time.sleep(SETTLE_S)
        turns = TakingTurns(plain_first=number % 2 == 1)  # which side follows the pause alternates
        bwopt_block(STEPS, [turns])
        np.asarray(turns.loss)  # the plain loop's one read per block, outside both clocks
        per_block.append(turns.plain_s / turns.bwopt_s)
    return per_block


def timed(block, batch: int):
    def measure() -> float:
        # Every side's pipeline refills the buffers its last block drained: on the same cores, that
        # would slow whichever side runs next (measured: bwopt / plain loop 0.960 with four sides
        # and no pause, 1.009 with two), so all buffers refill before the clock starts.
        time.sleep(SETTLE_S)
        started = time.perf_counter()
        block(STEPS)
        return STEPS * batch / (time.perf_counter() - started)

    return measure


def measure_workload(name: str, rounds: int, pair_blocks: int) -> None:
    what, overrides, batch = WORKLOADS[name]
    print(
        f"vs_plain_loop {name}: {what}, digits, batch {batch}, blocks of {STEPS} steps, {rounds} alternated "
        f"rounds, wall clock around each block; {load_line()}",
        flush=True,
    )
    config, _ = compose(["tracking=none", *overrides, f"train.global_batch_size={batch}"])
    started_all = time.perf_counter()
    blocks = build_sides(config)
    for block in blocks.values():
        block(STEPS)  # tracing, the pipelines' buffers
    results = alternate({side: timed(block, batch) for side, block in blocks.items()}, rounds)
    print(f"{rounds} rounds, {time.perf_counter() - started_all:.0f} s; {load_line()}")
    for side, values in results.items():
        print(f"  {side:<34} examples/s {spread(values, ',.0f')}")
    for numerator, denominator, target in COMPARISONS:
        per_round = ratios(results[numerator], results[denominator])
        note = f"  target >= {target}: {verdict(per_round, target)}" if target else ""
        print(f"ratio {numerator} / {denominator}: {spread(per_round)}{note}", flush=True)
    for plain, target in PAIRED:
        if not pair_blocks:
            break
        started = time.perf_counter()
        per_block = paired_steps(blocks["bwopt"], blocks[plain], pair_blocks)
        note = f"  target >= {target}: {verdict(per_block, target)}" if target else ""
        print(
            f"paired steps bwopt / {plain} ({pair_blocks} blocks of {STEPS} pairs, "
            f"{time.perf_counter() - started:.0f} s; {load_line()}): {spread(per_block)}{note}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="all", help=f"comma-separated, of {', '.join(WORKLOADS)}, or all")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="alternated rounds per workload")
    parser.add_argument(
        "--pairs", type=int, default=PAIR_BLOCKS, help=f"blocks of {STEPS} paired steps per workload (0: none)"
    )
    arguments = parser.parse_args()
    names = list(WORKLOADS) if arguments.workload == "all" else arguments.workload.split(",")
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"--workload {','.join(unknown)}: expected some of {', '.join(WORKLOADS)}, or all")
    config, _ = compose(["tracking=none"])
    configure_devices(config)  # once per process, before the first workload
    for name in names:
        measure_workload(name, arguments.rounds, arguments.pairs)


if __name__ == "__main__":
    main()
