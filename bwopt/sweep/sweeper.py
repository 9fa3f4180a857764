"""What bwopt's sweepers (a plain sweep's, bwopt.sweep.plain; the search, bwopt.sweep.search; the
tuner, bwopt.sweep.tune) and its launcher share: the set-up, what a sweep keeps under another
launcher (the parent run, the report, failures in one line), and the schema's check of a job's
config before it is launched."""

import copy
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from bwopt.schema import SweepConfig
from bwopt.sweep.job import JobCrashed, per_override_set, shown

log = logging.getLogger(__name__)


class SweepFailed(SystemExit):
    """A sweep that measured nothing to answer with (the tuner's start, or every trial of a search,
    left no result): Python prints its message alone on stderr and exits 1, as for a SystemExit whose
    code is a string. Hydra lets it through: an Exception would get its HYDRA_FULL_ERROR hint."""


def prepare_sweep(
    config: DictConfig,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    parent_name: Optional[str],
    check_jobs: bool = False,
) -> Tuple[float, Any]:
    """(`sweep.accuracy_tolerance`, the configured launcher) for a sweeper's `setup`.

    Fixes `hydra.sweep.dir` once, so every batch of trials lands in one folder whatever the clock
    says later, and names the MLflow parent run when the launcher is bwopt's (one parent run for
    the whole sweep; None: named from the swept values); another launcher (submitit's for SLURM,
    Ray's) comes wrapped in `ParentBeside`, for the same parent run (tracking=mlflow), report and
    failure lines, and with `check_jobs` every job's config checked before any starts.
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
        return tolerance, launcher
    tracking = config.tracking if OmegaConf.select(config, "tracking.name") == "mlflow" else None
    check = functools.partial(refusal_of, hydra_context, config) if check_jobs and runs_bwopt(task_function) else None
    return tolerance, ParentBeside(launcher, tracking, parent_name, Path(config.hydra.sweep.dir), check)


class ParentBeside:
    """Another launcher's sweep with what bwopt's launcher adds to its own: one MLflow parent run,
    the sweep report, failed jobs in one line each, and (with `check`) every job's config checked
    before the first one starts.

    The parent run (tracking=mlflow, else none) starts with the first launch, named like bwopt's
    ('tune pipeline · 2026-12-06 22:40:01', or from the swept values: 'sweep pipeline.prefetch=0,2 ·
    …'); its id reaches the jobs as BWOPT_PARENT_RUN_ID (bwopt.tracking.PARENT_RUN_ENV) in the
    environment they inherit, which makes each job's run its child: submitit's local processes and
    sbatch's jobs (SLURM exports the submitting environment unless told otherwise) and the workers
    of a Ray cluster the launcher starts inherit it; a remote Ray cluster's do not, so their runs
    stay apart. Like bwopt's launcher it writes the report and ends the run after every launch
    (`finish_sweep`), and resumes it for the next; the sweeper then annotates it (`parent`) as it
    does the launcher's.

    A job fails two ways under another launcher: it raises (Hydra's `run_job` returns the error) or
    its process exits non-zero, as bwopt's does on bad data, and then the launcher raises (Ray's
    `WorkerCrashedError`, submitit's `UncompletedJobError`) and hands back no job of the batch. Either
    way each job of the batch comes back: a job that wrote its `summary.json` as completed, with its
    throughput, the others as failed (`FailedJobReturn`), so a plain sweep ends with one line naming
    the first failure and exit code 1, as under bwopt's launcher, and the tuner and the search go on.
    """

    def __init__(self, launcher, tracking, name: Optional[str], sweep_dir: Path, check=None) -> None:
        self.launcher, self.tracking, self.name, self.sweep_dir = launcher, tracking, name, sweep_dir
        self.check = check  # overrides -> why bwopt's schema refuses that job, or None
        self.parent = None  # bwopt.tracking.ParentRun, from the first launch
        self.log_ranking = True  # the report's ranking sentence in the log (the tuner turns it off)
        # the keys the jobs' runs are named by: set by a sweeper (the searched keys); else those that vary in a batch
        self.swept_keys: Optional[List[str]] = None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from bwopt.sweep.parent import sweep_name, varied_keys
        from bwopt.tracking import PARENT_RUN_ENV, ParentRun
        from bwopt.tracking.names import SWEPT_KEYS_ENV

        numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
        if self.check is not None:
            exit_if_refused([(num, overrides, self.check(overrides)) for num, overrides in zip(numbers, job_overrides)])
        if self.tracking is not None and self.parent is None:
            name = self.name or sweep_name(job_overrides)
            self.parent = ParentRun.start(self.tracking, name, self.sweep_dir)
        elif self.parent is not None:
            self.parent.resume()
        named_by = self.swept_keys if self.swept_keys is not None else varied_keys(job_overrides)
        environment = {SWEPT_KEYS_ENV: json.dumps(named_by)}
        if self.parent is not None:
            environment[PARENT_RUN_ENV] = self.parent.run_id
        previous = {key: os.environ.get(key) for key in environment}
        os.environ.update(environment)
        status = "KILLED"
        try:
            try:
                returns = list(self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx))
            except HydraException:  # Hydra's own (a job that does not compose): no job ran
                status = "FAILED"
                raise
            except Exception as error:  # a job's process that exited non-zero, as the launcher tells it
                log.debug("the launcher raised", exc_info=True)
                returns = [self._read_back(num, overrides, error) for num, overrides in zip(numbers, job_overrides)]
            status = "FINISHED"
            return per_override_set([[num] for num in numbers], dict(zip(numbers, returns)), self.sweep_dir)
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            finish_sweep(self.sweep_dir, self.parent, status, self.log_ranking)

    def _read_back(self, num: int, overrides: Sequence[str], error: Exception) -> JobReturn:
        """Job `num`'s return from its folder, after the launcher raised instead of returning the batch."""
        from bwopt.summary import Summary

        summary = self.sweep_dir / str(num) / "summary.json"
        if summary.is_file():
            objective = Summary.from_dict(json.loads(summary.read_text())).objective
            return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=objective)
        # submitit's error holds the job's stderr, and bwopt's own line where the job printed one
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
        said = next((line for line in reversed(lines) if line.startswith("bwopt: ")), lines[0])
        # the launcher's error need not be this job's (Ray's and submitit's raise at the first job that failed)
        raised = f"{type(self.launcher).__name__} raised {type(error).__name__}: {said}"
        crashed = JobCrashed(f"job #{num} ({shown(overrides)}) left no result; {raised}")
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=crashed)


def exit_if_refused(jobs: Sequence[Tuple[int, Sequence[str], Optional[str]]]) -> None:
    """(number, overrides, why bwopt's schema refuses its config or None) of every job of a sweep:
    every refused one named at once, and exit code 2, before any job starts: a bad value must not
    cancel a sweep half-way, or be found only after other jobs trained."""
    bad = [f"  job {num} ({' '.join(overrides) or 'no overrides'}): {why}" for num, overrides, why in jobs if why]
    if bad:
        print(f"bwopt: invalid config in {len(bad)} of the sweep's jobs; none was started:", file=sys.stderr)
        print("\n".join(bad), file=sys.stderr, flush=True)
        sys.exit(2)


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
