"""bwopt's sweeper for a plain sweep (`python -m bwopt -m pipeline.prefetch=0,2`): Hydra's basic
sweeper, the same override grammar, batches and `hydra.sweeper.params`, with one difference: under
another launcher than bwopt's (`hydra/launcher=slurm`, `ray`, `submitit_local`) the launcher comes
wrapped in `bwopt.sweep.sweeper.ParentBeside`, so the sweep keeps what bwopt's launcher gives it:
every job's config checked before the first one starts, one MLflow parent run with the jobs as its
children, the report in the sweep folder and the parent run, and a failed job told in one line
(exit code 1) instead of the launcher's traceback. Under bwopt's launcher it is Hydra's basic
sweeper as it stands: that launcher does all of this itself.
"""

from dataclasses import dataclass
from typing import Dict, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from bwopt.sweep.sweeper import prepare_sweep


@dataclass
class PlainSweeperConf:
    """`hydra.sweeper.*` when `hydra/sweeper=bwopt_basic` (the default, from conf/plain_sweep.yaml):
    Hydra's basic sweeper's settings."""

    _target_: str = "hydra_plugins.bwopt_basic_sweeper.bwopt_basic_sweeper.BwoptBasicSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


class PlainSweeper(BasicSweeper):
    """The sweeper behind `hydra/sweeper=bwopt_basic` (Hydra instantiates its subclass in hydra_plugins)."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context = hydra_context
        self.config = config
        _, self.launcher = prepare_sweep(config, hydra_context, task_function, parent_name=None, check_jobs=True)
