"""Where Hydra finds bwopt's launcher (`hydra/launcher=bwopt`); the logic lives in bwopt.sweep.launcher.

Hydra imports every module under the `hydra_plugins` namespace package at start-up and instantiates
only plugin classes defined there (bwopt.plugins registers this one too, for installs where that
scan misses it), so this module defines the class and stays light: the launcher module imports
only Hydra and OmegaConf.
"""

from hydra.core.config_store import ConfigStore

from bwopt.sweep import launcher


class BwoptLauncher(launcher.ProcessPerJobLauncher):
    """Each job of a sweep in its own fresh process, one at a time; repeats; a report at the end."""


ConfigStore.instance().store(group="hydra/launcher", name="bwopt", node=launcher.BwoptLauncherConf, provider="bwopt")
