"""The per-stage picture of a training pipeline, from tf.data's own performance model, in a fresh process.

`python -m bwopt.sweep.tune_probe OVERRIDES_JSON OUTPUT_JSON [--whole-decode]` composes bwopt's config with the
overrides (a trial's), builds its training pipeline exactly as a run does (bwopt.inputs), reads
batches from it alone (no model, no step) and asks TensorFlow for the iterator's analytical model
(`tf.data.experimental.get_model_proto`, TensorFlow >= 2.15: per node, elements produced, its own
processing time, bytes produced, buffer sizes and parameters) twice, after a warm-up and after a
window of at least `WINDOW_S` seconds; the difference is the window's.

The model exists only with tf.data's autotuning on, so the probe turns `pipeline.options.autotune`
on (fixed parallelism and prefetch values stay as they are: autotune only tunes `autotune`
values) and turns off the rewrites that merge stages (map-and-batch fusion, map parallelisation,
parallel batch, injected prefetch), so that each stage is one node with its own time. When the
maps run per element and could run on whole batches instead, the pipeline is probed a second
time with `pipeline.vectorized_map=true`, for what its map costs per batch; where a per-element
map feeds the batch and the start turns map-and-batch fusion off, once more with it on, for what
the fused op costs per batch.

A start that decodes whole images after the shuffle (`fused_decode_crop: false`, a random
preprocessing, no cache) has its decoding timed apart and made a stage of its own before the
shuffle, where a cache would run it (bwopt.sweep.tune_decoding). A start that decodes only each
crop window (`fused_decode_crop: true`) is probed that way a second time, with `--whole-decode`
(hydra.sweeper.allow=[decode]): the stages of the pipeline decoding whole images.

The nodes on the pipeline's main chain become stages (bwopt.sweep.tune_decide.Stage): the source
(with every node off the chain: files read through interleave, the positions zipped in), the maps
(the one before shuffle is the deterministic cast or decode; those after it are random), shuffle
and repeat (random; every stage after it counts as random for caching), batch. A node's cost per
batch is its processing time over the window / the batches delivered.
"""

import json
import sys
import time
from pathlib import Path
from typing import Dict, List

from bwopt.sweep.tune_decoding import cpu_time_s, decode_apart, decoding_cost, training_images, with_decoding_apart

WINDOW_S = 1.5
MIN_BATCHES = 8
MAX_BATCHES = 400
WARMUP_BATCHES = 3
# What hydra.sweeper.allow=[decode] proposes from a fused decode of crop windows, probed without a cache.
WHOLE_DECODE = ["pipeline.fused_decode_crop=false", "pipeline.cache=off"]
MEASURING = [
    "tracking=none",
    "measure.ceilings=false",
    "pipeline.options.autotune=true",
    "pipeline.options.map_and_batch_fusion=false",
    "pipeline.options.map_parallelization=false",
    "pipeline.options.parallel_batch=false",
    "pipeline.options.inject_prefetch=false",
]
KINDS = (  # (substring of the node's name, kind), first match wins
    ("Prefetch", "skip"),
    ("Root", "skip"),
    ("Batch", "batch"),
    ("Map", "map"),
    ("Shuffle", "shuffle"),
    ("Repeat", "shuffle"),
    ("Cache", "skip"),
    ("Zip", "skip"),
)


def node_kind(name: str) -> str:
    return next((kind for part, kind in KINDS if part in name), "source")


def window(dataset) -> dict:
    """The models before and after the window, its batches, wall seconds and CPU seconds."""
    import tensorflow as tf

    iterator = iter(dataset)
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    before = tf.data.experimental.get_model_proto(iterator)
    started, cpu_started, batches = time.perf_counter(), cpu_time_s(), 0
    while batches < MAX_BATCHES and (batches < MIN_BATCHES or time.perf_counter() - started < WINDOW_S):
        next(iterator)
        batches += 1
    elapsed, cpu = time.perf_counter() - started, cpu_time_s() - cpu_started
    after = tf.data.experimental.get_model_proto(iterator)
    return {"before": before, "after": after, "batches": max(batches, 1), "s": elapsed, "cpu_s": cpu}


def main_chain(model) -> List[int]:
    """Node ids from the output down its first inputs (Zip's first input is the dataset itself)."""
    chain, node = [], model.output
    while node is not None and node in model.nodes:
        chain.append(node)
        inputs = list(model.nodes[node].inputs)
        node = inputs[0] if inputs else None
    return chain


def stages_of(measured: dict, batch_size: int, source_name: str, io_bound_source: bool) -> List[dict]:
    """The main chain's nodes as stages, source first: the nodes below the first other stage and
    every node off the chain (files read through interleave, the positions zipped in) fold into it."""
    before, after, batches = measured["before"], measured["after"], measured["batches"]

    def delta(node_id: int, field: str) -> float:
        old = before.nodes[node_id] if node_id in before.nodes else None
        return getattr(after.nodes[node_id], field) - (getattr(old, field) if old is not None else 0)

    chain = main_chain(after)
    off_chain_ns = sum(delta(node, "processing_time") for node in after.nodes if node not in chain)
    source = {"name": source_name, "node": "", "kind": "source", "cost_per_batch_s": off_chain_ns / 1e9 / batches}
    source.update(parallel=io_bound_source, random=False, io_bound=io_bound_source, output_bytes_per_example=0.0)
    stages, seen_shuffle, seen_batch = [source], False, False
    for node_id in reversed(chain):
        node = after.nodes[node_id]
        kind = node_kind(node.name)
        if kind == "skip":
            continue
        cost_s = delta(node_id, "processing_time") / 1e9 / batches
        elements = max(delta(node_id, "num_elements"), 1)
        examples_per_element = batch_size if seen_batch or kind == "batch" else 1
        output_bytes = delta(node_id, "bytes_produced") / elements / examples_per_element
        if kind == "source" and len(stages) == 1:
            source["node"] = f"{source['node']} {node.name}".strip()
            source["cost_per_batch_s"] += cost_s
            source["output_bytes_per_example"] = output_bytes
            continue
        seen_shuffle |= kind == "shuffle"
        name = {"shuffle": "shuffle, repeat", "batch": "batch"}.get(kind, node.name)
        if kind == "map":
            name = "map (vectorized)" if seen_batch else "map (augment)" if seen_shuffle else "map (cast)"
        seen_batch |= kind == "batch"
        stages.append(
            {
                "name": name,
                "node": node.name,
                "kind": kind if kind != "source" else "other",
                "cost_per_batch_s": cost_s,
                "parallel": kind == "map",
                "random": seen_shuffle,
                "io_bound": False,
                "output_bytes_per_example": output_bytes,
                "parameters": {parameter.name: parameter.value for parameter in node.parameters},
            }
        )
    return scaled(stages, measured["cpu_s"] / batches)


def scaled(stages: List[dict], cpu_per_batch_s: float) -> List[dict]:
    """The CPU stages' costs scaled to add up to the CPU time the process spent per batch.

    tf.data's model times each node's own work by the clock on the thread that runs it; what it
    leaves out (function calls' fixed cost per element, the other threads an op used) is shared
    out in proportion, so the costs are CPU time per batch, what the cores' budget is made of. An
    I/O-bound source keeps its clock time: it waits, and waiting takes no core."""
    cpu_stages = [stage for stage in stages if not stage["io_bound"]]
    total = sum(stage["cost_per_batch_s"] for stage in cpu_stages)
    for stage in stages:
        stage["model_cost_per_batch_s"] = stage["cost_per_batch_s"]
    if total <= 0 or cpu_per_batch_s <= 0:
        return stages
    for stage in cpu_stages:
        stage["cost_per_batch_s"] *= cpu_per_batch_s / total
    return stages


def cpu_flags() -> List[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo); none elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return line.partition(":")[2].split()


def sixteen_bit(device: str):
    """(policy, reason) for this host's `device` (bwopt.sweep.tune_decide.sixteen_bit_precision)."""
    import tensorflow as tf

    from bwopt.sweep.tune_decide import sixteen_bit_precision

    capability = None
    if device == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
        capability = details.get("compute_capability")
    return sixteen_bit_precision(device, cpu_flags() if device == "cpu" else (), capability)


def device_copy_bandwidth_bytes_per_s(device_name: str, num_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes per second from host memory to `device_name`: a uint8 tensor of `num_bytes` in host
    memory copied there (`tf.identity` under the device), `repeats` times, the fastest counting;
    each copy waits for its last byte (one element read back). One untimed copy first (allocation)."""
    import numpy as np
    import tensorflow as tf

    with tf.device("/CPU:0"):
        host = tf.constant(np.ones(num_bytes, dtype=np.uint8))
    fastest_s = float("inf")
    for attempt in range(repeats + 1):
        started = time.perf_counter()
        with tf.device(device_name):
            copied = tf.identity(host)
            copied[-1:].numpy()
        if attempt:
            fastest_s = min(fastest_s, time.perf_counter() - started)
    return num_bytes / fastest_s


def device_copy_s(device: str, batch_bytes: float) -> float:
    """Seconds a batch takes from host memory to the first GPU; 0 on a CPU target (no copy) and on
    a TPU (its host-to-device path is not timed)."""
    if device != "gpu":
        return 0.0
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return batch_bytes / device_copy_bandwidth_bytes_per_s(gpus[0].name) if gpus else 0.0


def exact_in_uint8(input_plan, source) -> bool:
    """Whether uint8 carries the training features exactly: integers, all within [0, 255]."""
    value_range = getattr(source, "value_range", None)
    value_range = value_range() if callable(value_range) else value_range
    in_byte_range = value_range is not None and value_range[0] >= 0 and value_range[1] <= 255
    return bool(input_plan.integer_features and in_byte_range)


def probe(overrides: List[str], whole_decode: bool = False) -> Dict[str, object]:
    """The per-stage picture of the training pipeline these overrides configure; with `whole_decode`
    and a start that decodes only the crop windows of images cropped at random, the stages of the
    same pipeline decoding whole images (`WHOLE_DECODE`), measured in a window of their own."""
    from hydra import compose, initialize_config_dir

    from bwopt.app import config_dir, validate
    from bwopt.data.sources import load_source
    from bwopt.inputs import Inputs, plan

    # the probe records nothing: the workload's tracking settings are not its own
    kept = [item for item in overrides if not item.lstrip("+~").startswith(("tracking.", "tracking="))]

    def configured(extra: List[str], measuring: List[str] = MEASURING):
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return validate(compose(config_name="config", overrides=[*kept, *measuring, *extra]))

    config = configured([])
    fusion_off = not configured([], measuring=[]).pipeline.options.map_and_batch_fusion  # the start's own
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    input_plan = plan(config, source)
    files = getattr(source, "train_files", None)
    reads_files = bool(files) or config.pipeline.tfrecord.enabled
    source_name = "source (files)" if reads_files else "source"
    batch_size = config.train.global_batch_size

    def measure(cfg) -> dict:
        return window(Inputs(cfg, source, input_plan).dataset(True, through_service=False))

    def staged(cfg, measured: dict) -> List[dict]:
        stages = stages_of(measured, batch_size, source_name, reads_files)
        if getattr(source, "encoded_images", False):
            for stage in stages:
                stage["name"] = stage["name"].replace("map (cast)", "map (decode)")
        if decode_apart(cfg.pipeline, source):
            cost = decoding_cost(training_images(source, input_plan), source)
            stages = with_decoding_apart(stages, cost, batch_size)
        return stages

    measured = measure(config)
    stages = staged(config, measured)
    whole_decode_stages = None
    if whole_decode and config.pipeline.fused_decode_crop:
        whole = configured(WHOLE_DECODE)
        if decode_apart(whole.pipeline, source):  # cropped at random: the decoding moves before the shuffle
            whole_decode_stages = staged(whole, measure(whole))

    def cost_toggled(override: str, replaced) -> float:
        """The per-batch cost of the stages at the indices `replaced` with `override` on: the whole
        pipeline's CPU time per batch in a window of its own, less the other stages as measured."""
        toggled = measure(configured([override]))
        others = sum(stage["cost_per_batch_s"] for at, stage in enumerate(stages) if at not in replaced)
        return max(toggled["cpu_s"] / max(toggled["batches"], 1) - others, 0.0)

    vectorized_cost = None
    maps = [at for at, stage in enumerate(stages) if stage["kind"] == "map"]
    if maps and not config.pipeline.vectorized_map and config.pipeline.preprocess != "imagenet":
        vectorized_cost = cost_toggled("pipeline.vectorized_map=true", maps)  # the maps on whole batches
    fused_cost = None
    feeds = [at for at in range(len(stages) - 1) if (stages[at]["kind"], stages[at + 1]["kind"]) == ("map", "batch")]
    if feeds and fusion_off:
        fused_cost = cost_toggled("pipeline.options.map_and_batch_fusion=true", (feeds[0], feeds[0] + 1))
    policy, policy_reason = sixteen_bit(config.device.name)
    train = config.train
    return {
        "stages": stages,
        "batch_size": batch_size,
        "examples_per_epoch": input_plan.num_train_examples,
        "steps_per_epoch": input_plan.steps_per_epoch,
        "epochs": config.train.epochs,
        "vectorized_map_cost_s": vectorized_cost,
        "whole_decode_stages": whole_decode_stages,
        "fused_map_batch_cost_s": fused_cost,
        "integer_features": exact_in_uint8(input_plan, source),
        "feature_bytes_per_example": input_plan.bytes_per_example,
        "num_files": len(files) if files and not config.pipeline.tfrecord.enabled else 0,
        "batches": measured["batches"],
        "window_s": measured["s"],
        "seconds_per_batch": measured["s"] / max(measured["batches"], 1),
        "cpu_seconds_per_batch": measured["cpu_s"] / max(measured["batches"], 1),
        "sixteen_bit": policy,
        "sixteen_bit_reason": policy_reason,
        "optimizer": train.optimizer,
        "learning_rate": train.learning_rate,
        "steps_per_epoch_set": train.steps_per_epoch is not None,
        "warmup_steps": max(train.warmup_steps, train.epoch_warmup_steps or 0),
        "device": config.device.name,
        "strategy": config.strategy.name,
        "device_copy_s": device_copy_s(config.device.name, input_plan.bytes_per_example * batch_size),
    }


def main(arguments: List[str]) -> int:
    overrides_file, output_file = Path(arguments[0]), Path(arguments[1])
    from bwopt.quiet import quiet

    quiet(False)
    picture = probe(json.loads(overrides_file.read_text()), whole_decode="--whole-decode" in arguments[2:])
    output_file.write_text(json.dumps(picture, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
