"""Where Hydra finds bwopt's sweeper (`hydra/sweeper=bwopt_optuna`); the logic lives in bwopt.sweep.search.

Hydra imports every module under the `hydra_plugins` namespace package at start-up and instantiates
only plugin classes defined there (bwopt.plugins registers this one too, for installs where that
scan misses it), so this module defines the class and stays light: the search module imports only
Hydra, OmegaConf and the sweep's results model (Optuna loads when a search starts).
"""

from hydra.core.config_store import ConfigStore

from bwopt.sweep import search


class BwoptSweeper(search.OptunaSearch):
    """An Optuna study (TPE by default) whose trials run through the configured launcher."""


ConfigStore.instance().store(group="hydra/sweeper", name="bwopt_optuna", node=search.BwoptSweeperConf, provider="bwopt")
