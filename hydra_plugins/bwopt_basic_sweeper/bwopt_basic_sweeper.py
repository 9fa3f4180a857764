"""Where Hydra finds bwopt's sweeper for plain sweeps (`hydra/sweeper=bwopt_basic`, conf/config.yaml's
default); the logic lives in bwopt.sweep.plain.

Hydra imports every module under the `hydra_plugins` namespace package at start-up and instantiates
only plugin classes defined there (bwopt.plugins registers this one too, for installs where that
scan misses it), so this module defines the class and stays light: Hydra, OmegaConf and bwopt's
sweep set-up, no TensorFlow.
"""

from hydra.core.config_store import ConfigStore

from bwopt.sweep import plain


class BwoptBasicSweeper(plain.PlainSweeper):
    """Hydra's basic sweeper, keeping bwopt's parent run, report and failure lines under any launcher."""


ConfigStore.instance().store(group="hydra/sweeper", name="bwopt_basic", node=plain.PlainSweeperConf, provider="bwopt")
