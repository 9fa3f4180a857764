"""bwopt's JPEG input pipeline against the one a user would write by hand, and the payoff of
decoding only the crop window.

Workload: data=sample_images (real JPEGs, 160-256 px, made once from scikit-learn's sample
photographs and cached under outputs/sample_images/), its training split (80 % of the files,
stratified), TF Model Garden's training preprocessing per image: read the file, sample a
distorted bounding box (8-100 % of the area, aspect 3/4 to 4/3), decode that window, flip at
random, resize to 64x64, round to uint8; batches of 32. Nothing trains: the input alone.
Four sides, alternated round by round (in `_common.alternate`'s order):

- `bwopt fused`: a real bwopt run in `mode=input` (bwopt.modes.run_input_only: the distributed
  training dataset iterated alone, each batch waited for) with pipeline=default,
  `pipeline.preprocess=imagenet`, `pipeline.vectorized_map=false`, `pipeline.transfer_dtype=uint8`,
  `pipeline.fused_decode_crop=true` (tf.io.decode_and_crop_jpeg); its reported throughput
  (timed steps only);
- `bwopt decode-then-crop`: the same with `pipeline.fused_decode_crop=false` (decode the whole
  JPEG, then crop);
- `bwopt decoded cache`: the same with `pipeline.cache=memory` too: the cache holds the decoded
  images (decoding is deterministic there), each epoch crops them afresh; the first epoch (25
  batches, 20 of them the warm-up) fills it;
- `hand-written`: `from_tensor_slices((files, labels)) -> shuffle -> repeat -> map(read, sample
  box, decode_and_crop_jpeg, flip, resize, uint8; AUTOTUNE) -> batch -> prefetch(AUTOTUNE)`,
  iterated in Python; wall clock around the same number of timed batches after the same warm-up.

Printed: each side's examples/s and the per-round ratios, as `_common.spread` gives them (the
geometric mean with its 95 % interval, the median, min-max); beside them each side's CPU time per
example (the process's CPU seconds, every thread, over the timed batches: bwopt's
`cpu_s_per_example`, `time.process_time` around the hand-written loop) and the ratio
hand-written / bwopt, which reads above 1 where bwopt's pipeline does the same work with less
CPU. Both pipelines keep the 2 cores busy, so their throughput is the cores over the CPU per
example; the CPU figure barely moves with the machine's speed from one second to the next, which
swings single rounds' throughput ratios by ±40 % here.
Target: bwopt fused / hand-written >= 0.98 (met, missed or within noise of it, by the ratio's
interval). No target for fused / decode-then-crop: it is what the optimisation buys on these
small JPEGs (faster, slower or no difference detected); none for decoded cache / fused either.

Run: `.venv/bin/python benchmarks/jpeg_pipeline.py [--rounds N]` (7 rounds, about 100-130 s on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` runs one short round (the smoke test).
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Tuple

from _common import (
    QUIET,
    SMOKE,
    alternate,
    compose,
    configure_devices,
    interval95,
    load_line,
    ratios,
    run_bwopt,
    spread,
    verdict,
)

ROUNDS = 1 if SMOKE else 7
BATCH = 32
IMAGE_SIZE = (64, 64)
WARMUP = 5 if SMOKE else 20
STEPS = 10 if SMOKE else 400
WORKLOAD = [
    *QUIET,
    "mode=input",
    "tracking=none",
    "measure.plots=false",
    "measure.min_timed_s=0",  # both sides time the same number of batches
    "data=sample_images",
    f"data.num_images={200 if SMOKE else 1000}",
    f"data.image_size=[{IMAGE_SIZE[0]},{IMAGE_SIZE[1]}]",
    "pipeline=default",
    "pipeline.preprocess=imagenet",
    "pipeline.vectorized_map=false",
    "pipeline.transfer_dtype=uint8",
    f"train.global_batch_size={BATCH}",
    "train.epochs=1",
    f"train.steps_per_epoch={WARMUP + STEPS}",
    f"train.warmup_steps={WARMUP}",
]


def hand_written_dataset(config):
    """The pipeline a user writes from the tf.data guide, over bwopt's training files."""
    import tensorflow as tf

    from bwopt.data.sources import load_source
    from bwopt.inputs import plan

    source = load_source(config.data, config.seed, config.split.validation_fraction)
    indices = plan(config, source).train_indices
    files, labels = list(source.files[indices]), source.labels[indices]
    whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])

    def load(path, label):
        data = tf.io.read_file(path)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(data),
            whole_image,
            min_object_covered=0.08,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.image.random_flip_left_right(tf.io.decode_and_crop_jpeg(data, window, channels=3))
        image = tf.image.resize(image, IMAGE_SIZE)
        return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8), label

    dataset = tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files), seed=0).repeat()
    dataset = dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def examples_per_s(dataset) -> Tuple[float, float]:
    """(examples per second, CPU seconds per example) of `dataset` over STEPS batches after
    WARMUP, iterated in Python."""
    iterator = iter(dataset)
    for _ in range(WARMUP):
        next(iterator)
    cpu_started, started = time.process_time(), time.perf_counter()
    for _ in range(STEPS):
        next(iterator)
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    return STEPS * BATCH / wall_s, cpu_s / (STEPS * BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="alternated rounds (the interval narrows as 1/sqrt)")
    rounds = parser.parse_args().rounds
    print(
        f"jpeg_pipeline: mode=input, sample_images -> imagenet preprocessing -> {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}, "
        f"batch {BATCH}, {STEPS} timed batches, {rounds} alternated rounds; {load_line()}",
        flush=True,
    )
    started_all = time.perf_counter()
    fused = compose([*WORKLOAD, "pipeline.fused_decode_crop=true"])
    unfused = compose([*WORKLOAD, "pipeline.fused_decode_crop=false"])
    decoded_cache = compose([*WORKLOAD, "pipeline.fused_decode_crop=false", "pipeline.cache=memory"])
    configure_devices(fused[0])
    with tempfile.TemporaryDirectory() as scratch:

        def bwopt_side(config):
            def measure():
                figures = run_bwopt(*config, Path(scratch) / "run").figures
                return figures.throughput_examples_per_s, figures.cpu_s_per_example

            return measure

        sides = {
            "bwopt fused": bwopt_side(fused),
            "bwopt decode-then-crop": bwopt_side(unfused),
            "bwopt decoded cache": bwopt_side(decoded_cache),
            "hand-written": lambda: examples_per_s(hand_written_dataset(fused[0])),
        }
        measured = alternate(sides, rounds)
    print(f"{rounds} rounds, {time.perf_counter() - started_all:.0f} s")
    results = {name: [rate for rate, _ in values] for name, values in measured.items()}
    cpu = {name: [cpu_s * 1e6 for _, cpu_s in values] for name, values in measured.items()}
    for name, values in results.items():
        print(f"  {name:<24} examples/s {spread(values, ',.0f')}")
        print(f"  {'':<24} CPU-us per example {spread(cpu[name], ',.1f')}")
    per_round = ratios(results["bwopt fused"], results["hand-written"])
    target = f"target >= 0.98: {verdict(per_round, 0.98)}"
    print(f"ratio bwopt mode=input / hand-written tf.data: {spread(per_round)}  {target}")
    per_round = ratios(cpu["hand-written"], cpu["bwopt fused"])
    print(f"CPU per example, hand-written / bwopt mode=input: {spread(per_round)}  {comparison(per_round)}")
    per_round = ratios(results["bwopt fused"], results["bwopt decode-then-crop"])
    print(f"ratio fused decode-and-crop / decode-then-crop: {spread(per_round)}  {comparison(per_round)}")
    per_round = ratios(results["bwopt decoded cache"], results["bwopt fused"])
    print(f"ratio decoded cache / fused (no cache): {spread(per_round)}  {comparison(per_round)}")
    per_round = ratios(cpu["bwopt fused"], cpu["bwopt decoded cache"])
    print(f"CPU per example, fused / decoded cache: {spread(per_round)}  {comparison(per_round)}")


def comparison(per_round) -> str:
    """'faster', 'slower' or 'no difference detected', from the ratios' interval against 1."""
    low, high = interval95(per_round)
    return "faster" if low > 1 else "slower" if high < 1 else "no difference detected"


if __name__ == "__main__":
    main()
