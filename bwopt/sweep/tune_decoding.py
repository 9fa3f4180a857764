"""What a random image map spends decoding whole images, apart from the crops it cuts from them, for
the probe (bwopt.sweep.tune_probe).

A start that decodes whole images after the shuffle (`fused_decode_crop: false`, a random
preprocessing, no cache) does in its random map what a cache would do before the shuffle:
decoding, which is deterministic there. tf.data's model cannot see it apart (the map is one node),
so up to 64 training images (bwopt.memory.SAMPLED_IMAGES) are decoded alone, as the pipeline
decodes them, for the CPU time and the bytes of one, and their random crops are cut from the
decoded images held in a cache, as a pipeline with the cache after its decode cuts them, for the
CPU time of one crop. The decoding's share of the random map becomes a stage of its own before
the shuffle, which hands on the decoded images (`with_decoding_apart`).
"""

import resource
from pathlib import Path
from typing import List, NamedTuple

DECODE_WINDOW_S = 0.3
PASSES = 8


class DecodingCost(NamedTuple):
    """CPU seconds per image, each timed alone on one thread, and the bytes of one decoded image."""

    decode_s: float  # decoding the whole image
    crop_s: float  # cutting, resizing and flipping its random crop from the decoded image
    decoded_bytes: float


def cpu_time_s() -> float:
    """This process's CPU time, user and system, every thread (getrusage)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def training_images(source, input_plan) -> List[bytes]:
    """The encoded bytes of up to `SAMPLED_IMAGES` training images (as many as the memory check
    reads the headers of): image files', or a TFRecord file's."""
    from bwopt.memory import SAMPLED_IMAGES

    count = SAMPLED_IMAGES
    if hasattr(source, "files"):
        return [Path(path).read_bytes() for path in source.files[input_plan.train_indices][:count]]
    return [encoded.numpy() for encoded, _ in source.open_file(source.train_files[0]).take(count)]


def cpu_per_element_s(passes_of, elements_per_pass: int, seconds: float) -> float:
    """CPU seconds per element of `passes_of(passes)` (a tf.function reducing `passes` passes over
    the elements in the runtime, traced and warmed up already), `PASSES` passes at a time until
    `seconds`."""
    import tensorflow as tf

    runs, started = 0, cpu_time_s()
    while runs < 1 or cpu_time_s() - started < seconds:
        passes_of(tf.constant(PASSES, tf.int64))
        runs += 1
    return (cpu_time_s() - started) / (runs * PASSES * elements_per_pass)


def decoding_cost(images: List[bytes], source, seconds: float = DECODE_WINDOW_S) -> DecodingCost:
    """What decoding one of `images` whole costs, and cutting its random crop from it after: each
    as the pipeline runs it (bwopt.preprocess), in a tf.data map on one thread, reduced in place;
    the crops from the decoded images in a cache, each pass with seeds of its own."""
    import tensorflow as tf

    from bwopt.preprocess import Decoding, decode, randomly_cropped

    decoding = Decoding(tuple(source.feature_shape[:2]), False, bool(getattr(source, "jpeg_only", False)))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    images_read = tf.data.Dataset.from_tensor_slices(images)
    decoded = images_read.map(lambda data: decode(data, decoding)).cache()
    count = len(images)

    def total_bytes(dataset):
        return dataset.with_options(options).reduce(tf.constant(0, tf.int64), lambda total, size: total + size)

    @tf.function  # traced once: the passes run in the runtime alone
    def decoding_passes(passes):
        return total_bytes(images_read.repeat(passes).map(lambda data: tf.size(decode(data, decoding), tf.int64)))

    cut_from_decoded = Decoding(decoding.image_size, False, decoding.jpeg_only, decoded=True)

    def crop(index, image):
        seeds = tf.stack([tf.stack([index, index]), tf.stack([tf.bitwise.invert(index), index])])
        return tf.size(randomly_cropped(image, seeds, cut_from_decoded), tf.int64)

    @tf.function
    def cropping_passes(passes):
        return total_bytes(decoded.repeat(passes).enumerate().map(crop))

    # one untimed pass each: it traces the function, and the second fills the cache
    one = int(decoding_passes(tf.constant(1, tf.int64))) / count
    cropping_passes(tf.constant(1, tf.int64))
    decode_s = cpu_per_element_s(decoding_passes, count, seconds)
    crop_s = cpu_per_element_s(cropping_passes, count, seconds)
    return DecodingCost(decode_s, crop_s, one)


def with_decoding_apart(stages: List[dict], cost: DecodingCost, batch_size: int) -> List[dict]:
    """The stages with the decoding of whole images a deterministic stage of its own before the
    shuffle, where a cache would run it (`decode_apart`), handing on `cost.decoded_bytes` per
    example: its cost per batch, `cost.decode_s` per image, moves out of the random map that runs
    it now, which keeps the rest. Where the decoding and the crops, timed alone, add up to more
    than the random map measured in the pipeline (tiny images, whose per-call costs weigh more
    alone), both are scaled down to it, so that the crops never read as free."""
    shuffle = next(index for index, stage in enumerate(stages) if stage["kind"] == "shuffle")
    random_map = next(stage for stage in stages[shuffle:] if stage["kind"] == "map")
    measured = random_map["cost_per_batch_s"]
    decode_s, crop_s = max(cost.decode_s, 0.0) * batch_size, max(cost.crop_s, 0.0) * batch_size
    if decode_s + crop_s > measured:
        decode_s = measured * decode_s / (decode_s + crop_s) if decode_s + crop_s > 0 else 0.0
    random_map["cost_per_batch_s"] = measured - decode_s
    decode = {
        "name": "map (decode)",
        "node": f"{random_map['node']} (its decoding)",
        "kind": "map",
        "cost_per_batch_s": decode_s,
        "parallel": True,
        "random": False,
        "io_bound": False,
        "output_bytes_per_example": cost.decoded_bytes,
    }
    return [*stages[:shuffle], decode, *stages[shuffle:]]


def decode_apart(pipeline, source) -> bool:
    """Whether the start decodes whole images after the shuffle, where a cache would decode them
    before it (bwopt.image_pipeline.decodes_before_cache): a random image preprocessing with
    `fused_decode_crop: false` and no cache."""
    from bwopt.pipeline import caches
    from bwopt.schema.pipeline import RANDOM_PREPROCESSINGS

    images = getattr(source, "encoded_images", False) and pipeline.preprocess in RANDOM_PREPROCESSINGS
    return images and not pipeline.fused_decode_crop and not caches(pipeline)
