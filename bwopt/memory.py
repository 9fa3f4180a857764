"""Memory a run will need, refused before anything is loaded when it cannot be free.

Counted in host bytes after the transfer cast: a synthetic data set, the largest batch with its
activations, and every buffer the training pipeline fills (`check_buffers_fit`). Without this,
tf.data answers a buffer beyond memory with SIGSEGV, std::bad_alloc or an out-of-memory traceback.
No TensorFlow here.
"""

from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from bwopt.data.images import ImageFileSource
from bwopt.inputs import LABEL_BYTES, InputPlan
from bwopt.schema import ConfigError


def available_memory_bytes() -> int:
    """Memory free for this run now: available physical pages (Linux; elsewhere all of it), or the
    address space left under RLIMIT_AS when one is set and smaller."""
    import os
    import resource

    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 2**62
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        try:
            used = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            used = 0
        available = min(available, max(0, limit - used))
    return available


def memory_error(key: str, value, needed: int, available: int) -> ConfigError:
    return ConfigError(
        f"{key}={value} needs about {needed / 2**30:,.1f} GiB, but {available / 2**30:,.1f} GiB of memory "
        "is free; lower it"
    )


def check_fits_in_memory(config, available_bytes: Optional[int] = None) -> None:
    """Refuse, before anything is loaded, data and batches that cannot fit in memory.

    Counted: a synthetic data set as it is generated (float32, before a uint8 conversion), and the
    largest training or inference batch as float32 model inputs, times 4 for the activations and
    gradients beside them (a floor: a wide model needs more).
    """
    available = available_memory_bytes() if available_bytes is None else available_bytes
    data = config.data
    shape = data.image_shape if data.name == "synthetic" else getattr(data, "feature_shape", [8, 8, 1])
    if data.name in ("images", "sample_images"):
        shape = [*data.image_size, 3]
    example_bytes = int(np.prod(shape)) * 4

    def refuse(key: str, value, needed: int) -> None:
        raise memory_error(key, value, needed, available)

    if data.name == "synthetic" and data.num_examples * example_bytes > 0.8 * available:
        refuse(
            f"data.num_examples (of data.image_shape={list(shape)})",
            data.num_examples,
            data.num_examples * example_bytes,
        )
    batch = config.train.global_batch_size
    if batch * example_bytes * 4 > 0.5 * available:
        refuse("train.global_batch_size", batch, batch * example_bytes * 4)
    sizes = config.measure.inference_batch_sizes
    if sizes and max(sizes) * example_bytes * 4 > 0.5 * available:
        refuse("measure.inference_batch_sizes", list(sizes), max(sizes) * example_bytes * 4)


# tf.data allocates a shuffle buffer's slots up front, one std::vector<Tensor> (24 bytes) each.
SHUFFLE_SLOT_BYTES = 24


def buffer_bytes(config, input_plan: InputPlan, element_bytes: int) -> List[Tuple[str, object, int]]:
    """(key, value, bytes) of every buffer the training pipeline fills, in host bytes after the cast.

    `element_bytes`: one element as the shuffle buffer and cache hold it. The shuffle buffer holds
    at most an epoch's elements (it comes before repeat) but allocates all its slots; prefetch
    holds batches; each replica's buffer holds per-replica batches, `per_replica_buffer_size` of
    them (a global batch each, over the replicas); `autotune` is bounded by tf.data itself.
    Through the tf.data service, the shuffle buffer and the cache run in its workers: with
    `pipeline.service.mode=local` each of the `num_workers` workers in this process holds its own;
    with `remote` they are the remote workers' memory, not this host's.
    """
    pipeline = config.pipeline
    batch_bytes = config.train.global_batch_size * input_plan.bytes_per_example
    shuffle = pipeline.shuffle_buffer
    service = pipeline.service
    copies = {"off": 1, "local": service.num_workers, "remote": 0}[service.mode]
    shuffle_bytes = min(shuffle, input_plan.num_train_examples) * element_bytes + shuffle * SHUFFLE_SLOT_BYTES
    sizes = [("pipeline.shuffle_buffer", shuffle, copies * shuffle_bytes)]
    if pipeline.prefetch != "autotune":
        sizes.append(("pipeline.prefetch", pipeline.prefetch, pipeline.prefetch * batch_bytes))
    if pipeline.cache == "memory":
        sizes.append(("pipeline.cache", "memory", copies * input_plan.num_train_examples * element_bytes))
    buffer = pipeline.distribute.per_replica_buffer_size
    sizes.append(("pipeline.distribute.per_replica_buffer_size", buffer, buffer * batch_bytes))
    return sizes


def check_buffers_fit(config, input_plan: InputPlan, element_bytes: int, available_bytes: Optional[int] = None) -> None:
    """Refuse, before anything runs, buffers that together cannot fit in 80 % of the memory free,
    naming the largest (tf.data would crash: SIGSEGV, std::bad_alloc, or an out-of-memory error)."""
    available = available_memory_bytes() if available_bytes is None else available_bytes
    sizes = buffer_bytes(config, input_plan, element_bytes)
    total = sum(size for _, _, size in sizes)
    if total > 0.8 * available:
        key, value, size = max(sizes, key=lambda item: item[2])
        raise ConfigError(
            f"{key}={value} needs about {size / 2**30:,.1f} GiB (all the pipeline's buffers: {total / 2**30:,.1f} "
            f"GiB), but {available / 2**30:,.1f} GiB of memory is free; lower it"
        )


# Images whose headers are read for the size of a decoded image.
SAMPLED_IMAGES = 64


def stored_element_bytes(config, source, input_plan: InputPlan) -> int:
    """One training element as the shuffle buffer and the cache hold it: decoded, in the transfer
    dtype; under a random image preprocessing (after them) the encoded image: its file's mean size
    (image files, read into the cache), or its records' (TFRecord); or, where decoding comes before
    the cache (`bwopt.image_pipeline.decodes_before_cache`), the decoded whole image: height × width
    × 3 bytes, from the headers of up to `SAMPLED_IMAGES` images (bwopt.data.image_headers)."""
    from bwopt.image_pipeline import decodes_before_cache

    if not (source.encoded_images and config.pipeline.preprocess != "none"):
        return input_plan.bytes_per_example
    if isinstance(source, ImageFileSource):
        files = source.files[input_plan.train_indices][:SAMPLED_IMAGES]
    else:
        files = source.train_files
    if decodes_before_cache(config.pipeline):
        pixels = decoded_pixels(source, files, config.data)
        if pixels:
            return int(np.mean(pixels) * 3) + LABEL_BYTES
    sizes = [Path(path).stat().st_size for path in files]
    if isinstance(source, ImageFileSource):
        return int(np.mean(sizes)) + LABEL_BYTES if sizes else input_plan.bytes_per_example
    return sum(sizes) // max(1, input_plan.num_train_examples) + LABEL_BYTES


def decoded_pixels(source, files, data) -> List[int]:
    """Height × width of sampled training images, from their headers: the image files `files`, or
    the first records of the first TFRecord file; images whose header cannot be read are left out."""
    from bwopt.data.image_headers import embedded_image_size, image_size
    from bwopt.data.records import first_records

    if isinstance(source, ImageFileSource):
        sizes = [image_size(Path(path).read_bytes()) for path in files]
    elif files:
        sizes = [embedded_image_size(record) for record in first_records(files[0], data.compression, SAMPLED_IMAGES)]
    else:
        sizes = []
    return [height * width for height, width in filter(None, sizes)]


def check_resources(config, source, input_plan: InputPlan) -> None:
    """Before anything runs: the pipeline's buffers fit in memory, its files on their disks (bwopt.disk)."""
    from bwopt.disk import check_output_paths

    element_bytes = stored_element_bytes(config, source, input_plan)
    check_buffers_fit(config, input_plan, element_bytes)
    check_output_paths(config, input_plan.num_train_examples, element_bytes)
