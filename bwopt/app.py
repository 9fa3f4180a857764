"""Hydra entry point: `python -m bwopt key=value ...`.

Only Hydra, OmegaConf and the schemas are imported here; TensorFlow and MLflow
load inside the runner, after the config has been validated.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bwopt.quiet import quiet
from bwopt.schema import Config, ConfigError, register_configs, unknown_key_message
from bwopt.signals import STOP


def config_dir() -> str:
    """The conf/ folder: shipped inside the wheel, or at the top of a source checkout."""
    package_dir = Path(__file__).resolve().parent
    for candidate in (package_dir / "conf", package_dir.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"bwopt's conf/ folder was not found next to {package_dir}")


def validate(cfg: DictConfig) -> Config:
    """Turn a composed config into typed objects, running every value check."""
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as error:  # OmegaConf's own errors carry the full key
        raise ConfigError(str(error)) from error


def run_job(cfg: DictConfig) -> float:
    """One Hydra job. A config error, found here or once the data is sized, exits with code 2."""
    from hydra.core.hydra_config import HydraConfig

    try:
        config = validate(cfg)
        quiet(config.verbose)  # before bwopt.run imports TensorFlow and MLflow
        from bwopt.run import run

        hydra = HydraConfig.get()
        summary = run(
            config,
            output_dir=Path(hydra.runtime.output_dir),
            resolved=OmegaConf.to_container(cfg, resolve=True),
            overrides=list(hydra.overrides.task),
        )
    except ConfigError as error:
        print(f"bwopt: invalid config: {error}", file=sys.stderr)
        sys.exit(2)
    return summary.objective


register_configs()
hydra_main = hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")(run_job)


def main() -> None:
    # Set explicitly: a process started in the background inherits SIGINT ignored.
    STOP.install()
    for argument in sys.argv[1:]:
        message = unknown_key_message(argument)
        if message:
            print(f"bwopt: invalid config: {message}", file=sys.stderr)
            sys.exit(2)
    hydra_main()
