"""bwopt's training loop against Keras `model.fit`, both at the same `steps_per_execution`, on one workload.

Both sides train the default MLP (bwopt.models.build_model with conf/model/mlp.yaml: Flatten,
Dense 128 relu, Dense 10) with Adam (learning rate 0.003) on scikit-learn's digits
(bwopt.data.sources.load_digits, all 1,797 images), global batch 64, under the default strategy,
with jit_compile off on both sides. Each side reads its own copy of the same tf.data pipeline,
built by `bwopt.pipeline.build_dataset` with the default pipeline config:

- bwopt N: `bwopt.train.train` itself (the real timed loop, its step timer as the only hook, no
  validation batches) with the step functions of `bwopt.train.make_step_functions(...,
  steps_per_execution=N)`: for N > 1 one compiled call runs N steps, taking its batches from
  the distributed iterator inside the graph, and the host reads the results once per call
  (`train.steps_per_execution`);
- fit N: a Keras model made of `Rescaling(1/16)` followed by the same MLP, compiled with the same
  loss, optimizer, an accuracy metric (bwopt's step counts correct predictions too) and
  `steps_per_execution=N`, trained with `fit(steps_per_epoch=S, epochs=1, verbose=0)`.

N takes 1, 8 and 32 on both sides. Each measurement is the wall clock around one whole call,
`train(...)` or `fit(...)`, of S steps (a multiple of 32), each from a fresh iterator over its
dataset. Before the rounds every side gets one warm-up call (tracing, autotuning); then the six
sides alternate in rounds (in `_common.alternate`'s order). Printed: each side's
examples/s (`_common.spread`: geometric mean, 95 % interval, median, min-max), fit's best N
(highest median), and the per-round ratios bwopt N / fit N
at that N (the comparison that matters: target >= 1.0), and at every other N.

With Keras 3 on the TensorFlow backend fit reads its logs on the host after every execution,
as bwopt does, so at equal N both sides sync equally often.

Run: `.venv/bin/python benchmarks/vs_keras_fit.py` (about 60 s on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` runs one short round (the smoke test).
"""

import statistics
import time

from _common import SMOKE, alternate, compose, configure_devices, load_line, ratios, spread, verdict

GLOBAL_BATCH = 64
STEPS = 64 if SMOKE else 320  # per call; a multiple of every N
WARMUP_STEPS = 32 if SMOKE else 64
ROUNDS = 1 if SMOKE else 7
EXECUTIONS = (1, 8, 32)
SEED = 0
TARGET = 1.0


def build_sides(config, per_execution: int):
    """(bwopt block, fit block) at `per_execution` steps per call: callables that train `num_steps` steps."""
    import keras
    import tensorflow as tf

    from bwopt.data.sources import load_digits
    from bwopt.measure import StepPlan, StepTimer
    from bwopt.models import build_model, build_optimizer
    from bwopt.pipeline import array_elements, build_dataset
    from bwopt.train import StepSettings, make_step_functions, train

    source = load_digits()
    strategy = tf.distribute.get_strategy()

    def dataset():
        elements = array_elements(source.features, source.labels)
        return build_dataset(
            config.pipeline, elements, GLOBAL_BATCH, training=True, seed=SEED, value_range=source.value_range
        )

    def optimizer():
        return build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)

    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        bwopt_model = build_model(config.model, source.feature_shape, source.num_classes)
        bwopt_optimizer = optimizer()
        bwopt_optimizer.build(bwopt_model.trainable_variables)
    settings = StepSettings(
        GLOBAL_BATCH, source.feature_scale, config.device.jit_compile, steps_per_execution=per_execution
    )
    steps = make_step_functions(strategy, bwopt_model, bwopt_optimizer, settings)
    bwopt_data = strategy.experimental_distribute_dataset(dataset())

    def bwopt_block(num_steps: int) -> None:
        plan = StepPlan(1, num_steps // per_execution, 0, steps_per_execution=per_execution)
        train(steps, iter(bwopt_data), (), plan, [StepTimer()])

    keras.utils.set_random_seed(SEED)
    fit_model = keras.Sequential(
        [
            keras.Input(source.feature_shape),
            keras.layers.Rescaling(source.feature_scale),
            build_model(config.model, source.feature_shape, source.num_classes),
        ]
    )
    fit_model.compile(
        optimizer=optimizer(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=config.device.jit_compile,
        steps_per_execution=per_execution,
    )
    fit_data = dataset()

    def fit_block(num_steps: int) -> None:
        fit_model.fit(fit_data, steps_per_epoch=num_steps, epochs=1, verbose=0, shuffle=False)

    return bwopt_block, fit_block


def timed(block):
    def measure() -> float:
        started = time.perf_counter()
        block(STEPS)
        return STEPS * GLOBAL_BATCH / (time.perf_counter() - started)

    return measure


def main() -> None:
    import keras

    print(
        f"vs_keras_fit: bwopt.train.train vs Model.fit (Keras {keras.__version__}), default MLP, digits, "
        f"batch {GLOBAL_BATCH}, steps_per_execution N in {EXECUTIONS} on both sides;\n"
        f"  wall clock around {STEPS}-step calls after one warm-up call each, {ROUNDS} alternated rounds; "
        f"{load_line()}",
        flush=True,
    )
    started_all = time.perf_counter()
    config, _ = compose(["tracking=none"])
    configure_devices(config)
    blocks = {}
    for per_execution in EXECUTIONS:
        bwopt_block, fit_block = build_sides(config, per_execution)
        blocks[f"bwopt N={per_execution}"], blocks[f"fit N={per_execution}"] = bwopt_block, fit_block
    for block in blocks.values():
        block(WARMUP_STEPS)
    results = alternate({name: timed(block) for name, block in blocks.items()}, ROUNDS)
    print(f"{ROUNDS} rounds, {time.perf_counter() - started_all:.0f} s")
    for name, values in results.items():
        print(f"  {name:<12} examples/s {spread(values, ',.0f')}")
    best = max(EXECUTIONS, key=lambda n: statistics.median(results[f"fit N={n}"]))
    for per_execution in (best, *(n for n in EXECUTIONS if n != best)):
        per_round = ratios(results[f"bwopt N={per_execution}"], results[f"fit N={per_execution}"])
        label = f"ratio bwopt/fit at N={per_execution}"
        if per_execution == best:
            label += " (fit's best N)"
            note = f"  target >= {TARGET}: {verdict(per_round, TARGET)}"
        else:
            note = ""
        print(f"{label}: {spread(per_round)}{note}")


if __name__ == "__main__":
    main()
