"""From a data source to the batches a strategy distributes: split, shard, materialise, pipeline.

`plan` fixes the sizes and the timed steps before TensorFlow is imported; `Inputs` builds the training and
validation datasets for each input pipeline (one per worker), honouring the split, the
per-worker shard, TFRecord materialisation and the tf.data service.
"""

from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional

import numpy as np

from bwopt.data.custom import DatasetSource
from bwopt.data.images import ImageFileSource
from bwopt.data.sources import ArraySource
from bwopt.data.split import shard, train_validation_split
from bwopt.measure.timing import StepPlan
from bwopt.schema import ConfigError

LABEL_BYTES = 4  # int32


@dataclass
class InputPlan:
    """Sizes fixed before any TensorFlow work.

    Attributes:
        train_indices, validation_indices: example indices of an ArraySource or of the files of
            an ImageFileSource (None for other files and the user's datasets).
        num_train_examples, num_validation_examples: examples in each split.
        steps_per_epoch: training steps per epoch.
        steps: which steps of the run are timed (`step_plan`).
        bytes_per_example: host bytes of one example as transferred (features + label).
        feature_dtype: the features' dtype as stored by the source.
    """

    train_indices: Optional[np.ndarray]
    validation_indices: Optional[np.ndarray]
    num_train_examples: int
    num_validation_examples: int
    steps_per_epoch: int
    steps: StepPlan
    bytes_per_example: int
    feature_dtype: str

    @property
    def integer_features(self) -> bool:
        return bool(np.issubdtype(np.dtype(self.feature_dtype), np.integer))


def transfer_itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize  # NumPy has no bfloat16


def plan(config, source) -> InputPlan:
    """Split the source and size the epoch; raises ConfigError when nothing would be timed."""
    train_indices = validation_indices = None
    if isinstance(source, (ArraySource, ImageFileSource)):  # held out by example, or by image file
        train_indices, validation_indices = train_validation_split(
            source.labels, config.split.name, config.split.validation_fraction, config.seed
        )
        num_train, num_validation = len(train_indices), len(validation_indices)
    else:
        num_train, num_validation = source.num_train_examples, source.num_validation_examples
    transfer = config.pipeline.transfer_dtype
    if np.issubdtype(np.dtype(source.feature_dtype), np.floating) and transfer in ("uint8",):
        raise ConfigError(
            f"pipeline.transfer_dtype={transfer} would truncate the {source.feature_dtype} features of "
            f"data={config.data.name}; use float32, float16 or bfloat16 (or integer features, e.g. data.dtype=uint8)"
        )
    if num_validation == 0 and config.mode == "train":
        raise ConfigError(
            f"split.validation_fraction={config.split.validation_fraction} holds out no example of the "
            f"{num_train} of data={config.data.name}, so no epoch could be validated; raise it"
        )
    batch = config.train.global_batch_size
    steps_per_epoch = config.train.steps_per_epoch or num_train // batch
    if steps_per_epoch == 0:
        raise ConfigError(
            f"train.global_batch_size={batch} is larger than the {num_train} training examples; use a smaller batch"
        )
    per_execution = steps_per_execution(config)
    steps_per_epoch -= steps_per_epoch % per_execution  # whole executions per epoch
    if steps_per_epoch == 0:
        raise ConfigError(
            f"train.steps_per_execution={per_execution} is more than the {num_train // batch} steps of an epoch "
            f"({num_train} training examples in batches of {batch}); lower it or set train.steps_per_epoch"
        )
    steps = step_plan(config, steps_per_epoch)
    if config.mode != "inference" and not steps.timed():
        raise ConfigError(
            f"train.warmup_steps={config.train.warmup_steps}, train.epoch_warmup_steps="
            f"{config.train.epoch_warmup_steps} and the profiled steps leave no step to time out of "
            f"{config.train.epochs} epoch(s) of {steps_per_epoch} steps; lower them or train longer"
        )
    bytes_per_example = int(np.prod(source.feature_shape)) * transfer_itemsize(config.pipeline.transfer_dtype)
    return InputPlan(
        train_indices,
        validation_indices,
        num_train,
        num_validation,
        steps_per_epoch,
        steps,
        bytes_per_example + LABEL_BYTES,
        source.feature_dtype,
    )


def steps_per_execution(config) -> int:
    """Training steps per loop step: `train.steps_per_execution` in mode=train, else 1."""
    return config.train.steps_per_execution if config.mode == "train" else 1


def step_plan(config, steps_per_epoch: int) -> StepPlan:
    """The one place the config becomes warm-up, excluded and timed steps (bwopt.measure.timing).

    Training runs `train.epochs` epochs, each with a validation pass after it, so each later
    epoch starts with `train.epoch_warmup_steps` untimed steps, and profiled steps are left out.
    `mode=input` iterates the same number of batches without a break, as one epoch.

    With `train.steps_per_execution` N > 1 the plan counts loop steps, i.e. executions of N
    training steps (`steps_per_epoch` must be a multiple of N): warm-up and epoch warm-up are
    rounded up to whole executions, and an execution that holds a profiled step is left out.
    """
    train = config.train
    epoch_warmup = train.warmup_steps if train.epoch_warmup_steps is None else train.epoch_warmup_steps
    if config.mode != "train":
        return StepPlan(1, train.epochs * steps_per_epoch, train.warmup_steps)
    per_execution = steps_per_execution(config)
    start, count = config.measure.profile_start_step, config.measure.profile_num_steps
    profiled = range(start // per_execution, -(-(start + count) // per_execution)) if count else ()
    return StepPlan(
        train.epochs,
        steps_per_epoch // per_execution,
        -(-train.warmup_steps // per_execution),
        -(-epoch_warmup // per_execution),
        tuple(profiled),
        per_execution,
    )


class Inputs:
    """Builds per-pipeline datasets; TFRecord shards are written once, on first use."""

    def __init__(self, config, source, input_plan: InputPlan, service: Optional[Callable] = None) -> None:
        self.config = config
        self.source = source
        self.input_plan = input_plan
        self.service = service
        self.tfrecords: Dict[str, object] = {}

    @property
    def materialised(self) -> bool:
        return self.config.pipeline.tfrecord.enabled

    def host_arrays(self, training: bool):
        """(features, labels) of one split in host memory; a file source is read once for it."""
        if isinstance(self.source, ArraySource):
            indices = self.input_plan.train_indices if training else self.input_plan.validation_indices
            return self.source.features[indices], self.source.labels[indices]
        from bwopt.pipeline import file_elements

        files = self.source.train_files if training else self.source.validation_files
        batches = list(
            file_elements(self.config.pipeline, files, self.source.open_file).batch(1024).as_numpy_iterator()
        )
        return np.concatenate([features for features, _ in batches]), np.concatenate([labels for _, labels in batches])

    def tfrecord_files(self, training: bool):
        """The TFRecord shards of one split, written (or found in the cache) on first use."""
        from bwopt.data.tfrecord import materialise

        split = "train" if training else "validation"
        if split not in self.tfrecords:
            settings = self.config.pipeline.tfrecord
            self.tfrecords[split] = materialise(
                *self.host_arrays(training),
                directory=settings.directory,
                num_shards=settings.num_shards,
                compression=settings.compression,
            )
        return self.tfrecords[split]

    def elements(self, training: bool, num_pipelines: int = 1, pipeline_id: int = 0):
        """Single examples of one split, for input pipeline `pipeline_id` of `num_pipelines`."""
        from bwopt.pipeline import array_elements, file_elements, image_file_elements

        pipeline = self.config.pipeline
        if self.materialised:
            from bwopt.data.tfrecord import read_dataset

            files = self.tfrecord_files(training)
            paths = files.paths[pipeline_id::num_pipelines] if len(files.paths) >= num_pipelines else files.paths
            dataset = read_dataset(
                replace(files, paths=paths),
                pipeline.tfrecord.num_parallel_reads,
                pipeline.tfrecord.buffer_size_bytes,
                pipeline.map_parallelism,
            )
            if num_pipelines == 1:  # all of the shards: their count is known
                return counted(dataset, files.num_examples)
            return dataset if len(files.paths) >= num_pipelines else dataset.shard(num_pipelines, pipeline_id)
        if isinstance(self.source, (ArraySource, ImageFileSource)):
            indices = self.input_plan.train_indices if training else self.input_plan.validation_indices
            if num_pipelines > 1:
                indices = shard(indices, self.source.labels, self.config.split.name, num_pipelines, pipeline_id)
            if isinstance(self.source, ImageFileSource):  # the files' paths: the pipeline reads them
                return image_file_elements(self.source.files[indices], self.source.labels[indices], indices)
            return array_elements(self.source.features[indices], self.source.labels[indices])
        if isinstance(self.source, DatasetSource):
            dataset = self.source.train if training else self.source.validation
            return dataset.shard(num_pipelines, pipeline_id) if num_pipelines > 1 else dataset
        files = self.source.train_files if training else self.source.validation_files
        if len(files) < num_pipelines:
            return file_elements(pipeline, files, self.source.open_file).shard(num_pipelines, pipeline_id)
        files = files[pipeline_id::num_pipelines]
        elements = file_elements(pipeline, files, self.source.open_file)
        if self.source.count_examples is None:
            return elements
        return counted(elements, self.source.count_examples(files))

    def dataset(self, training: bool, input_context=None, through_service: bool = True):
        """Batches for one input pipeline: global batches, or per-replica ones under a context.

        Training batches go through the tf.data service when one is configured, unless `through_service` is False.
        """
        from bwopt.image_pipeline import build_image_dataset
        from bwopt.pipeline import build_dataset

        batch = self.config.train.global_batch_size
        num_pipelines, pipeline_id = 1, 0
        if input_context is not None:
            batch = input_context.get_per_replica_batch_size(batch)
            num_pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
        elements = self.elements(training, num_pipelines, pipeline_id)
        service = self.service if training and through_service else None
        pipeline = self.pipeline_config(training, num_pipelines, pipeline_id, elements.element_spec)
        if self.source.encoded_images:
            return build_image_dataset(
                pipeline,
                elements,
                batch,
                training=training,
                seed=self.config.seed,
                images=self.encoded_images(),
                service=service,
            )
        return build_dataset(
            pipeline,
            elements,
            batch,
            training=training,
            seed=self.config.seed,
            value_range=self.source.value_range,
            service=service,
        )

    def pipeline_config(self, training: bool, num_pipelines: int, pipeline_id: int, element_spec):
        """The pipeline config of one input pipeline: a file cache's prefix carries the key of what it
        holds (bwopt.disk.cache_prefix), so a cache another config wrote is never read.
        `element_spec`: the elements' (tf.data.Dataset.element_spec), part of the key."""
        import sys

        from bwopt.disk import cache_prefix, remove_partial_cache

        pipeline = self.config.pipeline
        if not training or pipeline.cache != "file":
            return pipeline
        prefix = cache_prefix(pipeline.cache_path, self.cache_identity(num_pipelines, pipeline_id, element_spec))
        if remove_partial_cache(prefix):
            print(
                f"bwopt: removed the unfinished file cache {prefix}* (pipeline.cache_path): a run "
                "stopped while writing it; it is written afresh",
                file=sys.stderr,
            )
        return replace(pipeline, cache_path=prefix)

    def cache_identity(self, num_pipelines: int, pipeline_id: int, element_spec) -> dict:
        """What decides the elements a file cache holds: the data's config, split and seed, the
        training examples (indices) or files (path, size, time), this pipeline's shard, the
        settings applied before the cache (the cast, the deterministic image preprocessing), and
        the elements' structure: tf.data reads a cache back without checking it, so a cache of
        another layout (an image's identity as a scalar, say, where the seeds' [2, 2] part is now
        expected) would be read silently, its values broadcast into other examples."""
        import dataclasses
        import hashlib
        import os

        config, pipeline = self.config, self.config.pipeline
        identity = {
            "data": dataclasses.asdict(config.data),
            "split": dataclasses.asdict(config.split),
            "seed": config.seed,
            "pipeline": [pipeline.transfer_dtype, pipeline.vectorized_map, pipeline.preprocess],
            "image": [pipeline.fused_decode_crop] if self.source.encoded_images else [],
            "shard": [pipeline_id, num_pipelines],
            "elements": repr(element_spec),
        }
        if self.input_plan.train_indices is not None:
            identity["indices"] = hashlib.sha256(np.asarray(self.input_plan.train_indices).tobytes()).hexdigest()
        files = getattr(self.source, "train_files", [])  # names, for the artificial source
        if isinstance(self.source, ImageFileSource):
            files = self.source.files[self.input_plan.train_indices]
        stamps = [(str(path), os.stat(path)) for path in files if os.path.exists(path)]
        identity["files"] = [[path, stat.st_size, stat.st_mtime_ns] for path, stat in stamps]
        return identity

    def encoded_images(self):
        """What the pipeline decodes: image files (by path) or encoded bytes (data.format=image)."""
        from bwopt.image_pipeline import EncodedImages

        if isinstance(self.source, ImageFileSource):
            return EncodedImages(self.source.image_size, paths=True, jpeg_only=self.source.jpeg_only)
        return EncodedImages(self.source.feature_shape[:2])

    def ready_dataset(self, input_context=None):
        """The training dataset's first batch, cached and repeated forever: batches that are always ready.

        Iterated through the same distribution as training, it times the fixed cost of fetching a
        batch (`bwopt.measure.overhead`). Built without the tf.data service.
        """
        from bwopt.data.tfrecord import tf_count

        dataset = self.dataset(True, input_context, through_service=False).take(1).cache().repeat()
        # The same buffer hand-off as training's last stage: next() then costs what it costs there.
        prefetch = self.config.pipeline.prefetch
        return dataset.prefetch(tf_count(prefetch)) if prefetch != 0 else dataset


def counted(dataset, num_examples: int):
    """`dataset` told how many elements it holds. A random stage needs the examples per pass
    (bwopt.pipeline.epoch_size); told, they are not counted by reading every record of the files
    through the pipeline at each build."""
    import tensorflow as tf

    return dataset.apply(tf.data.experimental.assert_cardinality(num_examples))
