"""Hydra entry point: `python -m bwopt key=value ...`.

Only Hydra, OmegaConf and the schemas are imported here; TensorFlow and MLflow
load inside the runner, after the config has been validated.
"""

import atexit
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import hydra
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from bwopt.cluster import ClusterEnvironmentError, ClusterError, PeerLost
from bwopt.data.records import DataError
from bwopt.disk import disk_full
from bwopt.plugins import register_plugins
from bwopt.quiet import quiet
from bwopt.redact import redact_in_place
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
    except MissingMandatoryValue as error:
        key = error.full_key
        message = f"{key} is not set and has no default: give it, e.g. {key}=VALUE" if key else str(error)
        raise ConfigError(message) from error
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

    hydra = HydraConfig.get()
    output_dir = Path(hydra.runtime.output_dir)
    redact_in_place(output_dir / ".hydra")  # Hydra wrote the config, secrets and all, before this job began
    try:
        config = validate(cfg)
        if output_dir.resolve() == Path.cwd().resolve():
            raise ConfigError(
                f"hydra.run.dir={hydra.run.dir!r} is the working directory, where the run's files would "
                "overwrite yours; give it a folder of its own, e.g. hydra.run.dir=outputs/my_run"
            )
        quiet(config.verbose)  # before bwopt.launch imports TensorFlow and MLflow
        from bwopt.launch import launch

        resolved = OmegaConf.to_container(cfg, resolve=True)
        summary = launch(config, output_dir, resolved, list(hydra.overrides.task))
    except ConfigError as error:
        print(f"bwopt: invalid config: {error}", file=sys.stderr)
        sys.exit(EXIT_INVALID_CONFIG)
    except DataError as error:  # before the run, or during it (the MLflow run is then FAILED)
        print(f"bwopt: bad data: {error}", file=sys.stderr)
        sys.exit(EXIT_INVALID_CONFIG)
    except ClusterEnvironmentError as error:  # TF_CONFIG or SLURM's variables, before TensorFlow
        print(f"bwopt: invalid cluster environment: {error}", file=sys.stderr)
        sys.exit(EXIT_INVALID_CONFIG)
    except UNAVAILABLE as error:
        print(f"bwopt: {error}", file=sys.stderr)
        sys.exit(EXIT_UNAVAILABLE)
    except PeerLost as error:  # the task that went away is the cause (a local cluster's launcher names it)
        print(f"bwopt: {error}", file=sys.stderr)
        if hydra.mode == RunMode.RUN:
            exit_without_teardown(1)
        sys.exit(1)
    except ClusterError as error:
        print(f"bwopt: cluster failed: {error}", file=sys.stderr)
        sys.exit(1)
    except OSError as error:  # checked up front; another writer can still fill the disk during the run
        full = disk_full(error)
        if full is None:
            raise
        where = f" writing {full.filename}" if full.filename else ""
        print(
            f"bwopt: the disk filled during the run{where} ({full.strerror}); the run ended FAILED and "
            "its MLflow run keeps what was measured; free some space and run again",
            file=sys.stderr,
        )
        sys.exit(1)
    return summary.objective


def exit_without_teardown(code: int) -> None:
    """End a process whose TensorFlow cluster runtime lost a peer mid-operation, once its run has
    ended with its records: exit handlers run (the stderr filter flushes), the interpreter's
    teardown does not. Tearing down the runtime's half-finished objects printed Python's
    "Exception ignored in ... WeakValueDictionary" traceback after the one-line reason."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _unavailable_errors() -> tuple:
    """What the machine or its services lack (no TensorFlow or MLflow import: these modules are light)."""
    from bwopt.cluster import ClusterUnavailable
    from bwopt.data.service import ServiceUnavailable
    from bwopt.devices import DeviceError
    from bwopt.tracking import TrackingUnavailable

    return (DeviceError, ServiceUnavailable, TrackingUnavailable, ClusterUnavailable)


UNAVAILABLE = _unavailable_errors()


def selectable_groups() -> str:
    """One line per config group a user picks from, `group: option, option`, an option in a
    subfolder named as it is chosen (`tracking: mlflow, none, server/mlflow`): the list `--help`
    prints (hydra.help.template in conf/config.yaml). Hydra's own list would add the schema
    groups, which are not choices, and show a subfolder as a group of its own."""
    from hydra.core.global_hydra import GlobalHydra

    if not GlobalHydra.instance().is_initialized():
        return ""
    loader = GlobalHydra.instance().config_loader()

    def options(group: str, prefix: str = ""):
        yield from (prefix + name for name in loader.get_group_options(group))
        for name in loader.list_groups(group):
            yield from options(f"{group}/{name}", f"{prefix}{name}/")

    groups = sorted(name for name in loader.list_groups("") if name not in ("hydra", "schema"))
    return "\n".join(f"{group}: {', '.join(sorted(options(group)))}" for group in groups)


register_configs()
register_plugins()  # before Hydra composes: its scan misses them in a default editable install
OmegaConf.register_new_resolver("bwopt_groups", selectable_groups, replace=True)
hydra_main = hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")(run_job)


class RunFolderCheck(Callback):
    """Refuses, before Hydra makes or writes the run's (or sweep's) folder, one that cannot be used
    (`unwritable_run_folder`), wherever it was set: on the command line, in a preset, in your own
    config (conf/config.yaml names it under `hydra.callbacks`)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        group, name = key.rsplit(".", 1)
        value = OmegaConf.to_container(OmegaConf.select(config, group), resolve=False)[name]
        message = unwritable_run_folder([f"{key}={value}"])
        if message:
            print(f"bwopt: invalid config: {message}", file=sys.stderr)
            sys.exit(EXIT_INVALID_CONFIG)


def unwritable_run_folder(arguments) -> Optional[str]:
    """Why the run folder in `arguments` (`key=value` strings) cannot be used, or None.

    Hydra makes the folder before bwopt runs and answers a failure with a traceback; its fixed
    part (up to the first `${...}`) is made here first, as Hydra would make it, and must have room
    for a run's files. An existing `hydra.run.dir` or `hydra.sweep.dir` that holds files no run or
    sweep wrote is the user's: Hydra and the run would overwrite its config.yaml, summary.json, plots
    (a sweep's: its numbered folders, multirun.yaml, report files).
    """
    from bwopt.disk import RUN_FOLDER_MIN_BYTES, make_folder

    for argument in arguments:
        key, _, value = argument.partition("=")
        key = key.lstrip("+")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value.strip("'\""):
            fixed = value.strip("'\"").split("${", 1)[0]
            folder = Path(fixed or ".")
            held = sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []
            try:
                make_folder(key, folder, RUN_FOLDER_MIN_BYTES, value)
            except ConfigError as error:
                return str(error)
            whole = fixed == value.strip("'\"")
            if whole and held and not written_by_bwopt(key, folder, held):
                what = "run" if key == "hydra.run.dir" else "sweep"
                return (
                    f"{key}={value} already holds files no {what} wrote ({', '.join(held[:4])}"
                    f"{', …' if len(held) > 4 else ''}), which the {what} would overwrite; give a new or empty folder, "
                    f"e.g. {key}={folder / what}"
                )
    return None


def written_by_bwopt(key: str, folder: Path, held) -> bool:
    """Whether an existing run or sweep folder is one a run or sweep wrote: a run's holds `.hydra/`;
    a sweep's Hydra's `multirun.yaml`, a report, or job folders with `.hydra/`."""
    if key == "hydra.run.dir":
        return ".hydra" in held
    return bool({"multirun.yaml", "report.md"} & set(held)) or any((folder / name / ".hydra").is_dir() for name in held)


# conf/hydra/launcher/ray.yaml shares its name with the plugin's own preset on purpose (bwopt's
# settings under the name users know), so Hydra validates it against the plugin's schema and says,
# where the plugin is installed, that it does so: a deprecation note for Hydra's developers, 3-4 times a sweep.
SCHEMA_MATCH_NOTE = r"\s*'hydra/launcher/ray' is validated against ConfigStore schema with the same name"


def main() -> None:
    # Set explicitly: a process started in the background inherits SIGINT ignored. SIGHUP (the
    # terminal or SSH session closed) ends the run as SIGTERM does, KILLED with its records.
    STOP.install()
    warnings.filterwarnings("ignore", message=SCHEMA_MATCH_NOTE, category=UserWarning)
    for argument in sys.argv[1:]:
        message = unknown_key_message(argument)
        if message:
            print(f"bwopt: invalid config: {message}", file=sys.stderr)
            sys.exit(2)
    try:
        hydra_main()
    except KeyboardInterrupt:  # the run already ended KILLED and printed what it measured
        print(f"bwopt: stopped by {STOP.requested or 'SIGINT'}", file=sys.stderr, flush=True)
        sys.exit(STOP.exit_code)
