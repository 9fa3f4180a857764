"""bwopt's Hydra plugins (`hydra/launcher=bwopt`, `hydra/sweeper=bwopt_basic`, `bwopt_optuna`, `bwopt_tuner`),
registered in code.

Hydra finds plugins by listing the folders of the `hydra_plugins` namespace package (pkgutil) and
importing every module there. A default editable install (`pip install -e .`) maps that namespace
through setuptools' import hook instead of a folder, which pkgutil cannot list: Hydra's scan then
misses bwopt's plugins, and outside the checkout their configs are not found. register_plugins()
imports them by name, which the import hook serves, and registers them with Hydra, so every install
mode works.

The classes still live in the top-level `hydra_plugins/` package: Hydra instantiates only plugin
classes defined under `hydra_plugins` (the `_target_`s in bwopt.sweep), and there its own scan
finds them wherever the package is a real folder (a checkout, a wheel, a compat editable install),
for any Hydra app and for `--info plugins`.
"""

import importlib

PLUGINS = (
    ("hydra_plugins.bwopt_launcher.bwopt_launcher", "BwoptLauncher"),
    ("hydra_plugins.bwopt_basic_sweeper.bwopt_basic_sweeper", "BwoptBasicSweeper"),
    ("hydra_plugins.bwopt_sweeper.bwopt_sweeper", "BwoptSweeper"),
    ("hydra_plugins.bwopt_tuner.bwopt_tuner", "BwoptTuner"),
)


def register_plugins() -> None:
    """Register bwopt's launcher and sweepers with Hydra; importing their modules stores their configs.

    Hydra's scan runs first (once, as Plugins.instance() is created) and may import a module afresh:
    the class taken from the module after it is the one the scan found, so registering it again
    changes nothing. Only Hydra and OmegaConf are imported.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    for module, name in PLUGINS:
        plugins.register(getattr(importlib.import_module(module), name))
