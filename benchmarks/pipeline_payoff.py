"""What the classic tf.data optimisations pay on the same workload, through bwopt's own code path.

Every run is a real bwopt experiment: the real conf/ composed with Hydra's compose API plus
overrides, validated with `bwopt.app.validate`, run by `bwopt.run.run` (tracking=none, no
memcpy test, no progress bar, its printed summary swallowed), and read back from
`summary.figures` (throughput in examples/s, input-wait fraction). Two comparisons, run
interleaved round by round (the order alternates between rounds, ABBA..., so drift in machine
speed hits both sides alike); every ratio printed is the median of the per-round ratios:

(a) an input-heavy workload: data=synthetic (2,048 uint8 32x32x3 images), 4 augmentation rounds
    per example, MLP, global batch 128, 2 epochs, 3 warm-up steps; pipeline=naive (serial map,
    no prefetch, autotune off) against pipeline=tuned (cache, vectorised autotuned map, autotuned
    prefetch, uint8 transfer). Printed: the throughput ratio tuned / naive.

(b) a workload with known latencies: data=artificial (each element sleeps 1 ms in a generator,
    each train step sleeps 20 ms), split=uniform, pipeline=naive, no shuffle, global batch 16;
    pipeline.prefetch=0 against pipeline.prefetch=2. Without prefetch a step costs input +
    compute; with it the two overlap and a step costs max(input, compute). The observed
    throughput ratio is printed next to the ratio predicted from the two latencies measured
    independently in the same round with plain perf_counter and none of bwopt's timing code:
    input = 48 batches (two passes over the training files) of the same tf.data pipeline
    (prefetch 0) iterated alone; compute = 30 calls of the same train step
    (bwopt.train.make_step_functions, with its 20 ms sleep) on one batch, each read on the host.

TensorFlow fixes its devices once per process, so all runs share the default device set-up
(2 logical CPUs; the default strategy uses the first).

Run: `.venv/bin/python benchmarks/pipeline_payoff.py` (about 55 s on 2 cores).
"""

import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROUNDS = 8
COMMON = ["tracking=none", "measure.memcpy_bandwidth=false", "measure.progress=false"]
SYNTHETIC = [
    "data=synthetic",
    "data.num_examples=2048",
    "data.image_shape=[32,32,3]",
    "pipeline.augment_repeats=4",
    "train.global_batch_size=128",
    "train.epochs=2",
    "train.warmup_steps=3",
]
ARTIFICIAL_BATCH = 16
ELEMENT_S = 0.001
COMPUTE_S = 0.020
ARTIFICIAL = [
    "data=artificial",
    "split=uniform",
    "pipeline=naive",
    "pipeline.shuffle_buffer=0",
    "data.num_files=4",
    "data.examples_per_file=128",
    f"data.element_latency_s={ELEMENT_S}",
    f"data.step_compute_s={COMPUTE_S}",
    f"train.global_batch_size={ARTIFICIAL_BATCH}",
    "train.epochs=1",
    "train.warmup_steps=2",
    "model.hidden_units=[8]",
]
VARIANTS = {
    "synthetic, pipeline=naive": [*SYNTHETIC, "pipeline=naive"],
    "synthetic, pipeline=tuned": [*SYNTHETIC, "pipeline=tuned"],
    "artificial, prefetch=0": [*ARTIFICIAL, "pipeline.prefetch=0"],
    "artificial, prefetch=2": [*ARTIFICIAL, "pipeline.prefetch=2"],
}
INPUT_BATCHES = 48  # two passes over the 3 training files (24 batches each)
COMPUTE_STEPS = 30


def compose(overrides):
    """(validated Config, resolved dict) of the real conf/ plus overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from bwopt.app import config_dir, validate

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[*COMMON, *overrides])
    return validate(cfg), OmegaConf.to_container(cfg, resolve=True)


def run_bwopt(config, resolved, scratch: Path):
    """One bwopt run; returns its TimingFigures (the printed summary is discarded)."""
    from bwopt.run import run

    with contextlib.redirect_stdout(io.StringIO()):
        summary = run(config, output_dir=scratch, resolved=resolved)
    if summary.status != "FINISHED" or summary.figures is None:
        raise RuntimeError(f"bwopt run ended {summary.status} with figures {summary.figures}")
    return summary.figures


def independent_latencies(config):
    """(input s per batch, compute s per step) of the artificial workload, timed without bwopt's timer."""
    import tensorflow as tf

    from bwopt.data.sources import load_artificial
    from bwopt.models import build_model, build_optimizer
    from bwopt.pipeline import build_dataset, file_elements
    from bwopt.train import make_step_functions

    source = load_artificial(config.data, config.seed, config.split.validation_fraction)
    elements = file_elements(config.pipeline, source.train_files, source.open_file)
    iterator = iter(build_dataset(config.pipeline, elements, ARTIFICIAL_BATCH, training=True, seed=config.seed))
    batch = next(iterator)
    started = time.perf_counter()
    for _ in range(INPUT_BATCHES):
        next(iterator)
    input_s = (time.perf_counter() - started) / INPUT_BATCHES

    strategy = tf.distribute.get_strategy()
    model = build_model(config.model, source.feature_shape, source.num_classes)
    optimizer = build_optimizer(config.train.optimizer, config.train.learning_rate, config.device.precision)
    optimizer.build(model.trainable_variables)
    steps = make_step_functions(
        strategy, model, optimizer, ARTIFICIAL_BATCH, source.feature_scale, False, step_compute_s=source.step_compute_s
    )
    for _ in range(2):  # tracing
        [float(value) for value in steps.train_step(batch)]
    started = time.perf_counter()
    for _ in range(COMPUTE_STEPS):
        [float(value) for value in steps.train_step(batch)]
    compute_s = (time.perf_counter() - started) / COMPUTE_STEPS
    return input_s, compute_s


def main() -> None:
    from bwopt.devices import configure

    started_all = time.perf_counter()
    print_header()
    configs = {name: compose(overrides) for name, overrides in VARIANTS.items()}
    configure(configs["synthetic, pipeline=naive"][0].device)  # once per process: 2 logical CPUs
    throughput = {name: [] for name in VARIANTS}
    wait = {name: [] for name in VARIANTS}
    predicted = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_number in range(ROUNDS):
            for pair in (list(VARIANTS)[:2], list(VARIANTS)[2:]):
                for name in pair if round_number % 2 == 0 else reversed(pair):
                    figures = run_bwopt(*configs[name], Path(scratch) / "run")
                    throughput[name].append(figures.throughput_examples_per_s)
                    wait[name].append(figures.input_wait_fraction)
            input_s, compute_s = independent_latencies(configs["artificial, prefetch=0"][0])
            predicted.append((input_s, compute_s))
    report(throughput, wait, predicted, time.perf_counter() - started_all)


def print_header() -> None:
    lines = [
        "pipeline_payoff: bwopt runs (bwopt.run.run, tracking=none) compared side by side,",
        f"  {ROUNDS} interleaved rounds (ABBA order); ratio = median of the per-round throughput ratios",
        "  (a) synthetic 32x32x3 uint8, augment_repeats=4, batch 128, 2 epochs: pipeline=tuned vs pipeline=naive",
        f"  (b) artificial, {ELEMENT_S * 1e3:g} ms/element, {COMPUTE_S * 1e3:g} ms/step, batch {ARTIFICIAL_BATCH}, "
        + "pipeline=naive: prefetch=2 vs prefetch=0,",
        "      next to the ratio (input+compute)/max(input,compute) predicted from latencies timed alone",
    ]
    print("\n".join(lines), flush=True)


def per_round_ratio(throughput, numerator: str, denominator: str) -> float:
    return statistics.median(a / b for a, b in zip(throughput[numerator], throughput[denominator]))


def report(throughput, wait, predicted, wall_s: float) -> None:
    print(f"{ROUNDS} interleaved rounds of 4 bwopt runs each (bwopt.run.run, tracking=none), TF on CPU, {wall_s:.0f} s")
    for name in VARIANTS:
        print(
            f"  {name:<28} median {statistics.median(throughput[name]):10,.1f} examples/s"
            f"  (min {min(throughput[name]):,.1f}, max {max(throughput[name]):,.1f})"
            f"  input wait {statistics.median(wait[name]):6.1%}"
        )
    input_s = statistics.median(p[0] for p in predicted)
    compute_s = statistics.median(p[1] for p in predicted)
    expected = statistics.median((i + c) / max(i, c) for i, c in predicted)
    print(
        f"  artificial, measured independently: input {input_s * 1e3:.2f} ms/batch, "
        f"compute {compute_s * 1e3:.2f} ms/step (medians over rounds)"
    )
    tuned = per_round_ratio(throughput, "synthetic, pipeline=tuned", "synthetic, pipeline=naive")
    prefetch = per_round_ratio(throughput, "artificial, prefetch=2", "artificial, prefetch=0")
    print(f"ratio synthetic+augment throughput tuned/naive: {tuned:.2f}")
    print(
        f"ratio artificial throughput prefetch=2/prefetch=0: {prefetch:.2f}"
        f" (predicted (input+compute)/max(input,compute): {expected:.2f})"
    )


if __name__ == "__main__":
    main()
