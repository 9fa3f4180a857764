"""What bwopt's sweepers (the search, bwopt.sweep.search; the tuner, bwopt.sweep.tune) share at set-up."""

from typing import Any, Tuple

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
