"""bwopt against the loop a user would write instead, on the identical workload.

Workload: MLP 512-512 (bwopt.models, conf/model/mlp.yaml with hidden_units
[512, 512]) on scikit-learn's digits, global batch 256, Adam 0.003, default strategy, CPU.
Four sides, alternated round by round (order reversed every other round), each timed after
its warm-up steps:

- `bwopt`: a real bwopt run (`bwopt.run.run`, pipeline=default, tracking=none), its reported
  throughput (timed steps only; the loop reads every step's results on the host);
- `bwopt spe=8`: the same with `train.steps_per_execution=8`;
- `plain loop`: a hand-written `tf.function` train step over
  `from_tensor_slices -> shuffle(1024) -> batch(256) -> prefetch(AUTOTUNE)`, the loss read once
  at the end; wall clock around the timed steps;
- `plain loop, bwopt pipeline`: that same loop over bwopt's `pipeline=default` dataset
  (`bwopt.pipeline.build_dataset`): the pipeline alone compared, loop held fixed.

Printed: median examples/s of each with min-max, and the median of per-round ratios.
Targets: bwopt / plain loop >= 0.98; bwopt pipeline / plain pipeline >= 1.0.

Run: `.venv/bin/python benchmarks/vs_plain_loop.py` (about 60 s on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` runs one short round (the smoke test).
"""

import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SMOKE = os.environ.get("BWOPT_BENCHMARK_SMOKE") == "1"
ROUNDS = 1 if SMOKE else 5
STEPS = 40 if SMOKE else 400
WARMUP = 16 if SMOKE else 40
BATCH = 256
OVERRIDES = [
    "tracking=none",
    "measure.memcpy_bandwidth=false",
    "measure.progress=false",
    "model.hidden_units=[512,512]",
    f"train.global_batch_size={BATCH}",
    "train.epochs=1",
    f"train.steps_per_epoch={STEPS}",
    f"train.warmup_steps={WARMUP}",
]


def compose(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from bwopt.app import config_dir, validate

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[*OVERRIDES, *overrides])
    return validate(cfg), OmegaConf.to_container(cfg, resolve=True)


def bwopt_side(overrides):
    from bwopt.run import run

    config, resolved = compose(overrides)

    def measure(scratch: Path) -> float:
        with contextlib.redirect_stdout(io.StringIO()):
            summary = run(config, output_dir=scratch, resolved=resolved)
        return summary.figures.throughput_examples_per_s

    return measure


def plain_side(config, use_bwopt_pipeline: bool):
    import keras
    import tensorflow as tf

    from bwopt.data.sources import load_digits
    from bwopt.models import build_model
    from bwopt.pipeline import array_elements, build_dataset

    source = load_digits()
    features, labels = source.features.astype("float32"), source.labels

    def dataset():
        if use_bwopt_pipeline:
            elements = array_elements(features, labels)
            return build_dataset(config.pipeline, elements, BATCH, training=True, seed=0)
        plain = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(1024, seed=0).repeat()
        return plain.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    def measure(scratch: Path) -> float:
        model = build_model(config.model, source.feature_shape, source.num_classes)
        optimizer = keras.optimizers.Adam(config.train.learning_rate)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x * source.feature_scale, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        iterator = iter(dataset())
        for _ in range(WARMUP):
            loss = step(*next(iterator))
        float(loss)
        started = time.perf_counter()
        for _ in range(STEPS - WARMUP):
            loss = step(*next(iterator))
        float(loss)
        return (STEPS - WARMUP) * BATCH / (time.perf_counter() - started)

    return measure


def main() -> None:
    from bwopt.devices import configure

    config, _ = compose([])
    configure(config.device)
    sides = {
        "bwopt": bwopt_side([]),
        "bwopt spe=8": bwopt_side(["train.steps_per_execution=8"]),
        "plain loop": plain_side(config, use_bwopt_pipeline=False),
        "plain loop, bwopt pipeline": plain_side(config, use_bwopt_pipeline=True),
    }
    print(
        f"vs_plain_loop: MLP 512-512, digits, batch {BATCH}, {STEPS - WARMUP} timed steps, {ROUNDS} rounds", flush=True
    )
    results = {name: [] for name in sides}
    started_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for round_number in range(ROUNDS):
            for name in list(sides) if round_number % 2 == 0 else reversed(list(sides)):
                results[name].append(sides[name](Path(scratch) / "run"))
    print(f"{ROUNDS} rounds, {time.perf_counter() - started_all:.0f} s")
    for name, values in results.items():
        spread = f"(min {min(values):,.0f}, max {max(values):,.0f})"
        print(f"  {name:<28} median {statistics.median(values):10,.0f} examples/s  {spread}")
    for numerator, denominator in (
        ("bwopt", "plain loop"),
        ("bwopt spe=8", "plain loop"),
        ("plain loop, bwopt pipeline", "plain loop"),
    ):
        ratios = [a / b for a, b in zip(results[numerator], results[denominator])]
        spread = f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        print(f"ratio {numerator} / {denominator}: median {statistics.median(ratios):.3f}  {spread}")


if __name__ == "__main__":
    main()
