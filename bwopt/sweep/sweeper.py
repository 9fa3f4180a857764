"""What bwopt's sweepers (the search, bwopt.sweep.search; the tuner, bwopt.sweep.tune) and its launcher
share: the set-up, the parent run under another launcher, and the schema's check of a job's config
before it is launched."""

import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from bwopt.schema import SweepConfig

log = logging.getLogger(__name__)


def prepare_sweep(
    config: DictConfig, hydra_context: HydraContext, task_function: TaskFunction, parent_name: str
) -> Tuple[float, Any]:
    """(`sweep.accuracy_tolerance`, the configured launcher) for a sweeper's `setup`.

    Fixes `hydra.sweep.dir` once, so every batch of trials lands in one folder whatever the clock
    says later, and names the MLflow parent run when the launcher is bwopt's (one parent run for
    the whole sweep); another launcher (submitit's for SLURM, Ray's) comes wrapped in
    `ParentBeside` with tracking=mlflow, for the same parent run.
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
    elif OmegaConf.select(config, "tracking.name") == "mlflow":
        launcher = ParentBeside(launcher, config.tracking, parent_name, Path(config.hydra.sweep.dir))
    return tolerance, launcher


class ParentBeside:
    """Another launcher's jobs as children of one MLflow parent run, with the sweep report, as
    bwopt's launcher keeps its own.

    The run starts with the first launch, named like bwopt's ('tune pipeline · 2026-12-06 22:40:01');
    its id reaches the jobs as BWOPT_PARENT_RUN_ID (bwopt.tracking.PARENT_RUN_ENV) in the
    environment they inherit, which makes each job's run its child: submitit's local processes and
    sbatch's jobs (SLURM exports the submitting environment unless told otherwise) and the workers
    of a Ray cluster the launcher starts inherit it; a remote Ray cluster's do not, so their runs
    stay apart. Like bwopt's launcher it writes the report and ends
    the run after every launch (`finish_sweep`), and resumes it for the next; the sweeper then
    annotates it (`parent`) as it does the launcher's.
    """

    def __init__(self, launcher, tracking, name: str, sweep_dir: Path) -> None:
        self.launcher, self.tracking, self.name, self.sweep_dir = launcher, tracking, name, sweep_dir
        self.parent = None  # bwopt.tracking.ParentRun, from the first launch
        self.log_ranking = True  # the report's ranking sentence in the log (the tuner turns it off)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from bwopt.tracking import PARENT_RUN_ENV, ParentRun

        if self.parent is None:
            self.parent = ParentRun.start(self.tracking, self.name, self.sweep_dir)
        else:
            self.parent.resume()
        previous = os.environ.get(PARENT_RUN_ENV)
        if self.parent is not None:
            os.environ[PARENT_RUN_ENV] = self.parent.run_id
        status = "KILLED"
        try:
            returns = self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
            status = "FINISHED"
            return returns
        except Exception:
            status = "FAILED"
            raise
        finally:
            if previous is None:
                os.environ.pop(PARENT_RUN_ENV, None)
            else:
                os.environ[PARENT_RUN_ENV] = previous
            finish_sweep(self.sweep_dir, self.parent, status, self.log_ranking)


def finish_sweep(sweep_dir: Path, parent, status: str, log_ranking: bool) -> None:
    """After a launch, whatever happened: write the sweep report (an error writing it does not hide
    the sweep's) and end the parent run (bwopt.tracking.ParentRun, or None) with `status`, FAILED
    when every job so far failed; a run not FINISHED gets `bwopt.end_reason`."""
    from bwopt.signals import STOP
    from bwopt.sweep.report import write_report

    report = None
    try:
        report = write_report(sweep_dir)
        if log_ranking and report.ranking.sentence:  # the sweep's answer, with its interval, as the last word
            log.info(report.ranking.sentence)
        log.info(f"Sweep report: {report.markdown_file}")
    except Exception as error:
        print(f"bwopt: warning: the sweep report could not be written: {error!r}", file=sys.stderr)
    if parent is None:
        return
    every_job_failed = report is not None and report.jobs and all(job.failed for job in report.jobs)
    if status == "FINISHED" and every_job_failed:
        status = "FAILED"
    reasons = {
        "KILLED": f"stopped by {STOP.requested}" if STOP.requested else "stopped",
        "FAILED": "every job failed" if every_job_failed else "the launch failed",
    }
    if status in reasons:
        parent.annotate([], {"bwopt.end_reason": reasons[status]})
    parent.end(status, report)


def runs_bwopt(task_function: TaskFunction) -> bool:
    """Whether the sweep's task is bwopt's own job (tests sweep tasks of their own, with other keys)."""
    from bwopt.app import run_job

    return getattr(task_function, "__wrapped__", task_function) is run_job


def refusal(config: DictConfig) -> Optional[str]:
    """Why bwopt's schema refuses a job's composed config (its `hydra` node aside), or None; no TensorFlow."""
    from bwopt.app import validate
    from bwopt.schema import ConfigError

    config = copy.deepcopy(config)
    with open_dict(config):
        del config["hydra"]
    try:
        validate(config)
    except ConfigError as error:
        return str(error)
    return None


def refusal_of(hydra_context: HydraContext, config: DictConfig, overrides: Sequence[str]) -> Optional[str]:
    """`refusal` of the job that `overrides` compose on the sweep's config."""
    return refusal(hydra_context.config_loader.load_sweep_config(config, list(overrides)))
