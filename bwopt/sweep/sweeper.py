"""What bwopt's sweepers (the search, bwopt.sweep.search; the tuner, bwopt.sweep.tune) and its launcher
share: the set-up, and the schema's check of a job's config before it is launched."""

import copy
from typing import Any, Optional, Sequence, Tuple

from hydra.core.plugins import Plugins
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from bwopt.schema import SweepConfig


def prepare_sweep(
    config: DictConfig, hydra_context: HydraContext, task_function: TaskFunction, parent_name: str
) -> Tuple[float, Any]:
    """(`sweep.accuracy_tolerance`, the configured launcher) for a sweeper's `setup`.

    Fixes `hydra.sweep.dir` once, so every batch of trials lands in one folder whatever the clock
    says later, and names the MLflow parent run when the launcher is bwopt's (one parent run for
    the whole sweep).
    """
    tolerance = OmegaConf.select(config, "sweep.accuracy_tolerance")
    tolerance = SweepConfig().accuracy_tolerance if tolerance is None else float(tolerance)
    with open_dict(config):
        config.hydra.sweep.dir = str(config.hydra.sweep.dir)
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=hydra_context, task_function=task_function, config=config
    )
    if hasattr(launcher, "parent_name"):
        launcher.parent_name = parent_name
    return tolerance, launcher


def runs_bwopt(task_function: TaskFunction) -> bool:
    """Whether the sweep's task is bwopt's own job (tests sweep tasks of their own, with other keys)."""
    from bwopt.app import run_job

    return getattr(task_function, "__wrapped__", task_function) is run_job


def refusal(config: DictConfig) -> Optional[str]:
    """Why bwopt's schema refuses a job's composed config (its `hydra` node aside), or None; no TensorFlow."""
    from bwopt.app import validate
    from bwopt.schema import ConfigError

    config = copy.deepcopy(config)
    with open_dict(config):
        del config["hydra"]
    try:
        validate(config)
    except ConfigError as error:
        return str(error)
    return None


def refusal_of(hydra_context: HydraContext, config: DictConfig, overrides: Sequence[str]) -> Optional[str]:
    """`refusal` of the job that `overrides` compose on the sweep's config."""
    return refusal(hydra_context.config_loader.load_sweep_config(config, list(overrides)))
