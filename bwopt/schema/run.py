"""Schemas of the run's own sections, `train` and `measure`, and of the top-level `mode`."""

from dataclasses import dataclass, field
from typing import List, Optional

from bwopt.schema.checks import ConfigError, check_at_least, check_choice

# Each choice list lives here once, as names; the module that builds the choice keys its table
# of builders by the same names (tests/test_schema.py checks that they agree).
OPTIMIZERS = ("adam", "sgd", "rmsprop")
# train: the timed training run; input: iterate the distributed dataset alone (the input
# ceiling); inference: forward passes of a freshly built model (bwopt.modes).
MODES = ("train", "input", "inference")


@dataclass
class TrainConfig:
    global_batch_size: int = 64
    epochs: int = 10
    # Steps excluded from every timing figure (tracing, autotuning, cache fill).
    warmup_steps: int = 5
    # Steps excluded at the start of every later epoch: during validation the input pipeline
    # fills its buffers, so the next steps get batches for free. null = warmup_steps; raise it
    # to the prefetch depth when that is larger.
    epoch_warmup_steps: Optional[int] = None
    # Steps per epoch; null for one pass over the training split.
    steps_per_epoch: Optional[int] = None
    # Training steps per compiled call (Keras's name): N > 1 loops over the distributed iterator
    # inside one tf.function and reads results on the host once per call, so the host's fixed cost
    # per step (fetch, dispatch, sync) is paid once per N steps; each epoch runs a whole number of calls.
    steps_per_execution: int = 1
    # Stop the run, FAILED, at the first NaN or infinite loss (Keras's TerminateOnNaN).
    terminate_on_nan: bool = True
    # Continue the most recent run of the same command that a signal stopped (bwopt.checkpoint);
    # a run folder (hydra.run.dir) that holds a stopped run's checkpoint is resumed in any case.
    resume: bool = False
    # Write that checkpoint when a signal stops a training run.
    checkpoint_on_stop: bool = True
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    lr_schedule: str = "constant"  # or cosine: from learning_rate to 0 over the run's training steps

    def __post_init__(self) -> None:
        check_at_least("train.global_batch_size", self.global_batch_size, 1)
        check_at_least("train.epochs", self.epochs, 1)
        check_at_least("train.warmup_steps", self.warmup_steps, 0)
        if self.epoch_warmup_steps is not None:
            check_at_least("train.epoch_warmup_steps", self.epoch_warmup_steps, 0)
        if self.steps_per_epoch is not None:
            check_at_least("train.steps_per_epoch", self.steps_per_epoch, 1)
        check_at_least("train.steps_per_execution", self.steps_per_execution, 1)
        if self.steps_per_epoch is not None and self.steps_per_epoch % self.steps_per_execution:
            raise ConfigError(
                f"train.steps_per_epoch={self.steps_per_epoch} is not a multiple of train.steps_per_execution="
                f"{self.steps_per_execution}; every epoch runs whole executions, so use a multiple of it"
            )
        check_choice("train.optimizer", self.optimizer, OPTIMIZERS)
        check_choice("train.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        if self.learning_rate <= 0:
            raise ConfigError(f"train.learning_rate={self.learning_rate!r}; expected a value > 0")


@dataclass
class MeasureConfig:
    """Figures beyond the timed loop; each costs extra time, so each can be turned off."""

    # Also measure the compute ceiling (the step on batches already on the device) and the
    # input ceiling (the distributed dataset iterated alone), `ceiling_steps` steps each, split
    # into `ceiling_blocks` alternating blocks (median and spread over the blocks).
    ceilings: bool = False
    ceiling_steps: int = 100
    ceiling_blocks: int = 5
    # Host memcpy bandwidth, the physical reference for bytes/s.
    memcpy_bandwidth: bool = True
    # Inference throughput and latency for these batch sizes after training ([] = off).
    inference_batch_sizes: List[int] = field(default_factory=list)
    inference_batches: int = 20
    # Forward passes per batch size left out of the figures (tracing for the new shape).
    inference_warmup_batches: int = 2
    # Capture a TensorFlow profile of steps [profile_start_step, + profile_num_steps); 0 = off.
    profile_start_step: int = 10
    profile_num_steps: int = 0
    # A live progress bar on interactive terminals.
    progress: bool = True
    # PNG plots of the step times (and of the ceilings) in the run folder and in MLflow.
    plots: bool = True
    # The timed window lasts at least this long: after the epochs, more training steps are timed
    # until it does (their updates come after the reported epoch metrics); 0 = the epochs only.
    min_timed_s: float = 3.0

    def __post_init__(self) -> None:
        check_at_least("measure.ceiling_steps", self.ceiling_steps, 2)
        check_at_least("measure.min_timed_s", self.min_timed_s, 0.0)
        check_at_least("measure.ceiling_blocks", self.ceiling_blocks, 1)
        if self.ceiling_steps < 2 * self.ceiling_blocks:
            raise ConfigError(
                f"measure.ceiling_steps={self.ceiling_steps} gives fewer than 2 steps to each of the "
                f"measure.ceiling_blocks={self.ceiling_blocks} blocks; raise ceiling_steps or lower ceiling_blocks"
            )
        check_at_least("measure.inference_batches", self.inference_batches, 2)
        check_at_least("measure.inference_warmup_batches", self.inference_warmup_batches, 0)
        if self.inference_batch_sizes and min(self.inference_batch_sizes) < 1:
            raise ConfigError(f"measure.inference_batch_sizes={self.inference_batch_sizes!r}; expected sizes >= 1")
        check_at_least("measure.profile_start_step", self.profile_start_step, 0)
        check_at_least("measure.profile_num_steps", self.profile_num_steps, 0)
