"""Hydra entry point: `python -m bwopt key=value ...`.

Only Hydra, OmegaConf and the schemas are imported here; TensorFlow and MLflow
load inside the runner, after the config has been validated.
"""

import sys
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bwopt.cluster import ClusterError
from bwopt.data.records import DataError
from bwopt.quiet import quiet
from bwopt.schema import Config, ConfigError, register_configs, unknown_key_message
from bwopt.schema.checks import check_known_and_finite
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
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as error:  # OmegaConf's own errors carry the full key
        raise ConfigError(str(error)) from error
    check_known_and_finite(config)
    return config


# Exit codes (README, "Bad input"): a config mistake, a missing device or tracking store, a signal.
EXIT_INVALID_CONFIG = 2
EXIT_UNAVAILABLE = 3


def run_job(cfg: DictConfig) -> float:
    """One Hydra job. A config error, found here or once the data is sized, exits with code 2; a
    device or tracking store that is not there, with code 3; neither leaves an MLflow run."""
    from hydra.core.hydra_config import HydraConfig

    try:
        config = validate(cfg)
        hydra = HydraConfig.get()
        output_dir = Path(hydra.runtime.output_dir)
        if output_dir.resolve() == Path.cwd().resolve():
            raise ConfigError(
                f"hydra.run.dir={hydra.run.dir!r} is the working directory, where the run's files would "
                "overwrite yours; give it a folder of its own, e.g. hydra.run.dir=outputs/my_run"
            )
        quiet(config.verbose)  # before bwopt.run imports TensorFlow and MLflow
        from bwopt.run import run

        if config.cluster.name != "none":  # a task of a cluster, or the launcher of a local one
            from bwopt.cluster import run_in_cluster as run
        resolved = OmegaConf.to_container(cfg, resolve=True)
        summary = run(config, output_dir=output_dir, resolved=resolved, overrides=list(hydra.overrides.task))
    except ConfigError as error:
        print(f"bwopt: invalid config: {error}", file=sys.stderr)
        sys.exit(EXIT_INVALID_CONFIG)
    except DataError as error:  # before the run, or during it (the MLflow run is then FAILED)
        print(f"bwopt: bad data: {error}", file=sys.stderr)
        sys.exit(EXIT_INVALID_CONFIG)
    except UNAVAILABLE as error:
        print(f"bwopt: {error}", file=sys.stderr)
        sys.exit(EXIT_UNAVAILABLE)
    except ClusterError as error:
        print(f"bwopt: cluster failed: {error}", file=sys.stderr)
        sys.exit(1)
    return summary.objective


def _unavailable_errors() -> tuple:
    """What the machine or its services lack (no TensorFlow or MLflow import: these modules are light)."""
    from bwopt.data.service import ServiceUnavailable
    from bwopt.devices import DeviceError
    from bwopt.tracking import TrackingUnavailable

    return (DeviceError, ServiceUnavailable, TrackingUnavailable)


UNAVAILABLE = _unavailable_errors()


register_configs()
hydra_main = hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")(run_job)


def unwritable_run_folder(arguments) -> Optional[str]:
    """Why the run folder given on the command line cannot be made, or None.

    Hydra makes the folder before bwopt runs and answers a failure with a traceback; its fixed
    part (up to the first `${...}`) is made here first, as Hydra would make it.
    """
    for argument in arguments:
        key, _, value = argument.partition("=")
        if key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and value.strip("'\""):
            fixed = value.strip("'\"").split("${", 1)[0]
            try:
                Path(fixed or ".").mkdir(parents=True, exist_ok=True)
            except OSError as error:
                reason = f"{error.strerror}: {error.filename}"
                return f"{key}={value}: the run folder cannot be made ({reason}); give a writable folder"
    return None


def main() -> None:
    # Set explicitly: a process started in the background inherits SIGINT ignored.
    STOP.install()
    for argument in sys.argv[1:]:
        message = unknown_key_message(argument)
        if message:
            print(f"bwopt: invalid config: {message}", file=sys.stderr)
            sys.exit(2)
    message = unwritable_run_folder(sys.argv[1:])
    if message:
        print(f"bwopt: invalid config: {message}", file=sys.stderr)
        sys.exit(EXIT_INVALID_CONFIG)
    try:
        hydra_main()
    except KeyboardInterrupt:  # the run already ended KILLED and printed what it measured
        print(f"bwopt: stopped by {STOP.requested or 'SIGINT'}", file=sys.stderr, flush=True)
        sys.exit(STOP.exit_code)
