"""Where Hydra finds bwopt's tuner (`hydra/sweeper=bwopt_tuner`); the logic lives in bwopt.sweep.tune.

Hydra imports every module under the `hydra_plugins` namespace package at start-up and instantiates
only plugin classes defined there (bwopt.plugins registers this one too, for installs where that
scan misses it), so this module defines the class and stays light: the tuner module imports only
Hydra, OmegaConf and bwopt's light modules (TensorFlow loads only in the probe's own process).
"""

from hydra.core.config_store import ConfigStore

from bwopt.sweep import tune
from bwopt.sweep.tune_setup import BwoptTunerConf


class BwoptTuner(tune.PipelineTuner):
    """Measure, change, verify: each proposal kept only when it beats the incumbent beyond the noise."""


ConfigStore.instance().store(group="hydra/sweeper", name="bwopt_tuner", node=BwoptTunerConf, provider="bwopt")
