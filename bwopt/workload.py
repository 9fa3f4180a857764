"""What the config builds, once: the data and its plan, devices and strategy, inputs, model,
optimizer and step functions, handed to a mode as one `Workload`.

It is built in two steps, because what can reject the config must come before the MLflow run
exists (a mistake then leaves no FAILED run):

    workload = Workload(config)
    workload.prepare()   # sizes, the source and its plan, the tf.data service checked, devices,
                         # strategy, the seed, and (training, inference) the model, checked
    ...                  # the Run starts tracking
    workload.build()     # the tf.data inputs and (training) the compiled steps

Only this module and the modes call into `bwopt.strategies` for what a strategy builds.
"""

from contextlib import ExitStack
from dataclasses import replace
from typing import Dict, List, Optional

from bwopt.data.sources import LOADED_WITH_TENSORFLOW, load_source
from bwopt.inputs import Inputs, plan
from bwopt.memory import check_fits_in_memory, check_resources
from bwopt.schema import Config, check_batch_divisible


class Workload:
    """One experiment's objects. Attributes are None until the step that builds them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.resources = ExitStack()  # servers the workload started (the local tf.data service)
        self.source = self.input_plan = None
        self.cluster = self.strategy = None
        self.replica_devices: List[str] = []
        self.stage_devices: List[str] = []  # model_parallel: the devices of its stages
        self.inputs: Optional[Inputs] = None
        self.model = self.optimizer = self.steps = None

    # --- before tracking ---------------------------------------------------------------------

    def prepare(self) -> None:
        """Everything that can reject the config: sizes, the data, the service, the devices."""
        config = self.config
        check_fits_in_memory(config)
        # A source that builds tensors to load (your own function) would fix TensorFlow's devices first.
        devices_first = config.data.name in LOADED_WITH_TENSORFLOW
        if devices_first:
            self._set_up_strategy()
        self.source = load_source(config.data, config.seed, config.split.validation_fraction)
        self.input_plan = plan(config, self.source)
        check_resources(config, self.source, self.input_plan)  # buffers in memory, files on disk
        service = config.pipeline.service
        if service.mode != "off":  # neither is a measurement
            from bwopt.data.service import check_loopback_only, check_reachable

            if service.mode == "remote":  # TensorFlow would wait for it forever
                check_reachable(service.address)
            else:
                check_loopback_only(service.allow_external_interfaces)
        if not devices_first:
            self._set_up_strategy()
        import tensorflow as tf

        tf.keras.utils.set_random_seed(config.seed)
        if config.mode != "input":  # the user's model, checked (what it returns, its output shape) before any record
            self._build_model()

    def _set_up_strategy(self) -> None:
        """Devices, then the strategy (TensorFlow fixes its devices first)."""
        from bwopt.cluster import resolve
        from bwopt.measure import reset_device_memory_peaks
        from bwopt.strategies import replica_devices, set_up_strategy, stage_devices

        # None without a cluster; a multi-process strategy joins its cluster here (bwopt.cluster).
        self.cluster = resolve(self.config.cluster, self.config.strategy)
        devices, self.strategy = set_up_strategy(
            self.config.strategy, self.config.device, self.cluster, self.config.cluster.startup_timeout_s
        )
        self.stage_devices = stage_devices(self.config.strategy, devices)
        self.replica_devices = self.stage_devices or replica_devices(self.strategy, devices)
        reset_device_memory_peaks(self.replica_devices)
        check_batch_divisible(self.config, self.strategy.num_replicas_in_sync)  # GPUs are counted only now

    def start_after_epoch(self, epochs_done: int) -> None:
        """A resumed run: its timed loop starts after the epochs the stopped run finished."""
        self.input_plan.steps = replace(self.input_plan.steps, first_epoch=epochs_done)

    def tags(self) -> Dict[str, object]:
        """What ran where, for the run's tags."""
        import tensorflow as tf

        from bwopt.cluster import describe

        return {
            "tensorflow_version": tf.__version__,
            "devices": ",".join(self.replica_devices),
            "strategy": self.config.strategy.name,
            "num_replicas": self.strategy.num_replicas_in_sync,
            **({"cluster_tasks": describe(self.cluster)} if self.cluster else {}),
        }

    # --- after tracking started ------------------------------------------------------------------

    def build(self) -> None:
        """The inputs, and for training the compiled step functions."""
        config = self.config
        self.inputs = Inputs(config, self.source, self.input_plan, service=self._data_service())
        if config.mode == "train":
            self.steps = self._step_functions()

    def _data_service(self):
        """The tf.data service transformation for pipeline.service (None when off)."""
        settings = self.config.pipeline.service
        if settings.mode == "off":
            return None
        from bwopt.data.service import LocalDataService, distribute

        address = settings.address
        if settings.mode == "local":
            service = LocalDataService(
                settings.num_workers, allow_external_interfaces=settings.allow_external_interfaces
            )
            address = self.resources.enter_context(service).address
        return lambda dataset: distribute(
            dataset, address, settings.processing_mode, settings.job_name, settings.compression
        )

    def _build_model(self) -> None:
        from bwopt.models import build_model, build_optimizer

        config, source = self.config, self.source
        with self.strategy.scope():
            self.model = build_model(config.model, source.feature_shape, source.num_classes, self.stage_devices)
            steps = self.input_plan.steps
            decay_steps = steps.epochs * steps.steps_per_epoch * steps.steps_per_execution  # training steps
            self.optimizer = build_optimizer(
                config.train.optimizer,
                config.train.learning_rate,
                config.device.precision,
                decay_steps if config.train.lr_schedule == "cosine" else None,
            )
            self.optimizer.build(self.model.trainable_variables)

    def _step_functions(self):
        """The compiled distributed train and evaluation steps; parameter_server schedules one step at a time."""
        from bwopt.strategies import TF_FUNCTION_STEPS
        from bwopt.train import StepSettings, make_step_functions

        config = self.config
        per_execution = 1 if config.strategy.name == "parameter_server" else config.train.steps_per_execution
        settings = StepSettings(
            config.train.global_batch_size,
            self.source.feature_scale,
            config.device.jit_compile,
            step_compute_s=self.source.step_compute_s,
            steps_per_execution=per_execution,
            direct_calls=config.strategy.name not in TF_FUNCTION_STEPS,
        )
        return make_step_functions(self.strategy, self.model, self.optimizer, settings)

    # --- what the modes iterate ---------------------------------------------------------------------

    def distributed_dataset(self, training: bool):
        """The training or validation dataset, distributed as pipeline.distribute says."""
        from bwopt.strategies import distribute_input

        return distribute_input(
            self.strategy, self.config.pipeline.distribute, lambda context: self.inputs.dataset(training, context)
        )

    def ready_batches(self):
        """An iterator over batches that are always ready, distributed like training's."""
        from bwopt.strategies import distribute_input

        return iter(distribute_input(self.strategy, self.config.pipeline.distribute, self.inputs.ready_dataset))

    def close(self) -> None:
        """Stop what the workload started."""
        self.resources.close()
