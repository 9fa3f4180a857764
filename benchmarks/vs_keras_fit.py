"""bwopt's timed training loop against Keras `model.fit` on the same model and the same data.

Both sides train the default MLP (bwopt.models.build_model with conf/model/mlp.yaml: Flatten,
Dense 128 relu, Dense 10) with Adam (learning rate 0.003) on scikit-learn's digits
(bwopt.data.sources.load_digits, all 1,797 images), global batch 64, under the default strategy,
with jit_compile off on both sides. Each side reads its own copy of the same tf.data pipeline,
built by `bwopt.pipeline.build_dataset` with the default pipeline config (parallel map, shuffle
1024, autotuned prefetch, float32 transfer):

- bwopt: `bwopt.train.train` itself (the real timed loop; its step timer as the only hook,
  no validation batches) with the train step of `bwopt.train.make_step_functions`, which casts
  and scales the features (x 1/16) on the device;
- fit: a Keras model made of `Rescaling(1/16)` followed by the same MLP, compiled with the same
  loss (sparse categorical cross-entropy from logits), optimizer and an accuracy metric (bwopt's
  step counts correct predictions too), trained with
  `fit(steps_per_epoch=N, epochs=1, verbose=0, shuffle=False)` (the dataset shuffles itself).

Each measurement is the wall clock (perf_counter) around one whole call, `train(...)` or
`fit(...)`, of N steps; each call starts from a fresh iterator over its dataset (bwopt:
`iter()` of the distributed dataset, made inside the timed call). Before the rounds,
each side gets one separate warm-up call (tracing, autotuning). The two then alternate in
interleaved rounds (the order alternates between rounds, ABBA..., so drift in machine speed hits
both alike). Printed: the median examples/s of each and the median of the per-round ratios
bwopt / fit.

Per-step host sync. The bwopt loop synchronises every step: it reads the step's loss and correct
count on the host, which timing compute requires. Where fit does not (a backend whose callbacks
are dispatched asynchronously), a ratio a bit below 1 is that price of per-step timing, not a
slower train step. But with Keras 3 on the TensorFlow backend (`keras.src.backend.IS_THREAD_SAFE`
is False) fit synchronises every step too: `CallbackList.on_train_batch_end` runs in the main
thread and converts the step's logs (loss, accuracy) to Python floats, so both loops wait for
every step and the ratio compares the rest of the per-step overhead (Keras' metric objects,
callbacks, logs, its iterator wrapper) against bwopt's plain loop. The header says which case
this run is in.

Run: `.venv/bin/python benchmarks/vs_keras_fit.py` (about 45 s on 2 cores).
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 64
STEPS = 300
WARMUP_STEPS = 50
ROUNDS = 20
SEED = 0


def default_config():
    from hydra import compose, initialize_config_dir

    from bwopt.app import config_dir, validate

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return validate(compose(config_name="config", overrides=["tracking=none"]))


def build_sides(config):
    """(bwopt block, fit block): callables that train for `steps` steps and return nothing."""
    import keras
    import tensorflow as tf

    from bwopt.data.sources import load_digits
    from bwopt.measure import StepPlan, StepTimer
    from bwopt.models import build_model, build_optimizer
    from bwopt.pipeline import array_elements, build_dataset
    from bwopt.train import make_step_functions, train

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
    steps = make_step_functions(
        strategy, bwopt_model, bwopt_optimizer, GLOBAL_BATCH, source.feature_scale, config.device.jit_compile
    )
    bwopt_data = strategy.experimental_distribute_dataset(dataset())

    def bwopt_block(num_steps: int) -> None:
        # No validation batches; the step timer is the hook every bwopt run has.
        train(steps, iter(bwopt_data), (), StepPlan(1, num_steps, 0), [StepTimer()])

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
    )
    fit_data = dataset()

    def fit_block(num_steps: int) -> None:
        fit_model.fit(fit_data, steps_per_epoch=num_steps, epochs=1, verbose=0, shuffle=False)

    return bwopt_block, fit_block


def keras_version() -> str:
    import keras

    return keras.__version__


def fit_syncs_every_step() -> bool:
    """Whether fit reads every step's logs on the host in the main thread (Keras 3: backends not thread-safe)."""
    try:
        from keras.src.backend import IS_THREAD_SAFE
    except ImportError:  # another Keras layout: assume the documented async dispatch
        return False
    return not IS_THREAD_SAFE


def block_wall_s(block) -> float:
    started = time.perf_counter()
    block(STEPS)
    return time.perf_counter() - started


def main() -> None:
    from bwopt.devices import configure

    lines = [
        f"vs_keras_fit: bwopt.train.train vs Model.fit, same MLP, digits, batch {GLOBAL_BATCH}, default strategy;",
        f"  wall clock around {STEPS}-step calls after one warm-up call each, {ROUNDS} interleaved rounds",
        "  (ABBA); ratio = median of the per-round examples/s ratios bwopt/fit.",
        "  bwopt's loop synchronises every step (it reads loss and correct count on the host, to time the step);",
    ]
    if fit_syncs_every_step():
        lines.append(
            f"  so does fit here (Keras {keras_version()}, TF backend: its callbacks read the logs on the host after"
            " every step),\n  so the ratio compares the rest of the per-step overhead"
        )
    else:
        lines.append("  fit does not: a ratio a bit below 1 is the price of per-step timing")
    print("\n".join(lines), flush=True)
    started_all = time.perf_counter()
    config = default_config()
    configure(config.device)
    sides = dict(zip(("bwopt loop", "keras fit"), build_sides(config)))
    for block in sides.values():
        block(WARMUP_STEPS)
    examples_per_s = {name: [] for name in sides}
    for round_number in range(ROUNDS):
        names = list(sides) if round_number % 2 == 0 else list(reversed(sides))
        for name in names:
            examples_per_s[name].append(STEPS * GLOBAL_BATCH / block_wall_s(sides[name]))
    report(examples_per_s, time.perf_counter() - started_all)


def report(examples_per_s, wall_s: float) -> None:
    print(f"{ROUNDS} rounds x {STEPS} steps x {GLOBAL_BATCH} examples, TF on CPU, {wall_s:.0f} s")
    for name, values in examples_per_s.items():
        print(
            f"  {name:<10} median {statistics.median(values):10,.1f} examples/s"
            f"  (min {min(values):,.1f}, max {max(values):,.1f})"
        )
    ratio = statistics.median(b / f for b, f in zip(examples_per_s["bwopt loop"], examples_per_s["keras fit"]))
    print(f"ratio examples/s bwopt/fit: {ratio:.3f}")


if __name__ == "__main__":
    main()
