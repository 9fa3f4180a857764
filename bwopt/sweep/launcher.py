"""bwopt's Hydra launcher: every job of a sweep in its own fresh Python process, one at a time.

Why a fresh process per job: TensorFlow fixes its devices (logical CPUs, memory growth, visible
GPUs, thread pools) once per process, so in one shared process the second job of a sweep over
them would measure the first job's set-up. Why one at a time: jobs side by side share the cores
and the memory bandwidth that bwopt measures; `max_parallel` opts into parallel jobs anyway.

How: each job is a plain `python -m bwopt.sweep.job JOB_FILE RESULT_FILE` started with
`subprocess`. As submitit's launcher does for a remote job, the job file holds Hydra's singleton
state, the HydraContext, the task function and the job's composed config, and the child calls
`hydra.core.utils.run_job` with them, then writes its JobReturn to the result file. A plain
interpreter is preferred to multiprocessing's 'spawn' context, which re-imports the parent's
`__main__` (bwopt's CLI, or pytest) in every child and returns results through a pipe that a
crashed child leaves behind half-written: here a job that died (an exception, `sys.exit(2)` from a
config error, a segfault, `kill -9`) is a process without a result file, its exit code says how
it ended, and the launcher records a failed JobReturn and goes on with the next job. Jobs run in
their own session, so Ctrl-C reaches the launcher alone: it forwards one signal to the running
jobs (each ends its MLflow run KILLED at its next step), starts no more, writes the report, ends
the parent run KILLED (with `bwopt.end_reason`) and re-raises. Jobs die with the launcher, even
when it is killed (PR_SET_PDEATHSIG).

A failed job is one line in the log (its number, its overrides, how it ended) and, when Hydra's
sweeper asks for the outcome of a failed override set, one line naming the first failed job of
the batch; the sweep then exits 1 without a traceback (`FailedJobReturn`).

Folders and order: with N override sets and `repeats` = k, the launcher starts N x k jobs in
rounds, A B C A B C ..., so that drift of the machine falls on every set alike. Job number n,
its folder `<sweep dir>/<n>/` (Hydra's `hydra.sweep.subdir`, `${hydra.job.num}`), is
`first * k + repeat * N + index`: with one batch (`first` = 0) folders 0..N-1 are the first round
in Hydra's order, N..2N-1 the second, and so on; `n mod N` is the override set and `n // N` the
repeat. Each folder gets `job.json` (number, repeat, overrides, exit code, start and wall time).

Hydra's sweepers expect one JobReturn per override set they asked for, in their order: a set
whose repeats all completed returns the median of their objectives; otherwise its first failed
repeat's JobReturn (with the failure) stands for it.

At the end of every batch, even when jobs failed (Hydra then skips its own end-of-sweep
callbacks), the report of the whole sweep folder is written (bwopt.sweep.report) and, with
`tracking=mlflow`, logged to the sweep's parent run (bwopt.tracking.sweeps).
"""

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from bwopt.redact import redact_in_place
from bwopt.sweep.job import JobCrashed, describe_failure, how_it_ended, per_override_set, shown

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2


@dataclass
class BwoptLauncherConf:
    """`hydra.launcher.*` when `hydra/launcher=bwopt`.

    Attributes:
        max_parallel: jobs running at the same time (1: one at a time, for undisturbed timings).
        repeats: runs of every override set, in interleaved rounds, each in its own folder.
        stop_timeout_s: after Ctrl-C or SIGTERM, how long running jobs get to end their runs
            before they are killed.
    """

    # Hydra instantiates launchers only from classes defined in the hydra_plugins package
    _target_: str = "hydra_plugins.bwopt_launcher.bwopt_launcher.BwoptLauncher"
    max_parallel: int = 1
    repeats: int = 1
    stop_timeout_s: float = 120.0


@dataclass
class Job:
    """One process to start: an override set's repeat, with its composed config and folder."""

    num: int
    index: int  # position of its override set in Hydra's batch
    repeat: int
    overrides: List[str]
    config: DictConfig
    folder: Path


@dataclass
class RunningJob:
    job: Job
    process: subprocess.Popen
    result_file: Path
    started_s: float  # time.monotonic()
    started_at: float  # time.time(), for the record


class ProcessPerJobLauncher(Launcher):
    """The launcher behind `hydra/launcher=bwopt` (Hydra instantiates its subclass in hydra_plugins)."""

    def __init__(self, max_parallel: int = 1, repeats: int = 1, stop_timeout_s: float = 120.0) -> None:
        # Checked in `setup`: Hydra wraps an error raised here in a traceback of its own.
        self.max_parallel = max_parallel
        self.repeats = repeats
        self.stop_timeout_s = stop_timeout_s
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.parent = None  # bwopt.tracking.ParentRun, kept across the batches of one sweep
        self.parent_name: Optional[str] = None  # set by a sweeper (bwopt.sweep.search); else from the overrides
        # the keys the jobs' runs are named by: set by a sweeper (the searched keys); else those that vary in a batch
        self.swept_keys: Optional[List[str]] = None
        self.log_ranking = True  # the report's sentence in the log; off under a sweeper that judges its own (tune)
        self._named_by: List[str] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self._refuse_invalid_settings()
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def _refuse_invalid_settings(self) -> None:
        """`hydra.launcher.*` checked like any other key: one line, exit 2, nothing started."""
        problems = [
            f"hydra.launcher.{key}={value!r} is out of range; expected {expected}"
            for key, value, valid, expected in (
                ("max_parallel", self.max_parallel, self.max_parallel >= 1, "an integer >= 1 (jobs at once)"),
                ("repeats", self.repeats, self.repeats >= 1, "an integer >= 1 (runs of each override set)"),
                ("stop_timeout_s", self.stop_timeout_s, self.stop_timeout_s > 0, "seconds > 0"),
            )
            if not valid
        ]
        if problems:
            print(f"bwopt: invalid config: {'; '.join(problems)}", file=sys.stderr, flush=True)
            sys.exit(2)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        redact_in_place(sweep_dir)  # Hydra's multirun.yaml
        jobs = self._plan(job_overrides, initial_job_idx, sweep_dir)
        from bwopt.sweep.parent import varied_keys

        self._named_by = self.swept_keys if self.swept_keys is not None else varied_keys(job_overrides)
        self._refuse_invalid_jobs(jobs)
        log.info(f"Launching {len(jobs)} jobs, each in a fresh process, {self.max_parallel} at a time")
        from bwopt.quiet import quiet_libraries

        quiet_libraries(self.config.verbose)  # MLflow's own lines, as the parent run starts
        self._start_parent(job_overrides, sweep_dir)
        returns: Dict[int, JobReturn] = {}
        status = "KILLED"
        try:
            self._run_all(jobs, sweep_dir, returns)
            status = "FINISHED"
        finally:
            try:
                self._finish(sweep_dir, status)
            finally:
                from bwopt.signals import STOP

                STOP.finishing = False
        sets = [[job.num for job in jobs if job.index == index] for index in sorted({job.index for job in jobs})]
        return per_override_set(sets, returns, sweep_dir)

    def _plan(self, job_overrides: Sequence[Sequence[str]], first: int, sweep_dir: Path) -> List[Job]:
        """Every job of this batch in launch order: k rounds over the override sets (see the module doc)."""
        jobs = []
        for repeat in range(self.repeats):
            for index, overrides in enumerate(job_overrides):
                num = first * self.repeats + repeat * len(job_overrides) + index
                config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                with open_dict(config):
                    config.hydra.job.id = num
                    config.hydra.job.num = num
                    # fixed here, so a job started later resolves no `${now:}` of its own
                    config.hydra.sweep.dir = str(sweep_dir)
                    config.hydra.sweep.subdir = str(config.hydra.sweep.subdir)
                folder = sweep_dir / config.hydra.sweep.subdir
                jobs.append(Job(num, index, repeat, list(overrides), config, folder))
        return jobs

    def _refuse_invalid_jobs(self, jobs: List[Job]) -> None:
        """Validate every job's config (bwopt's schema, no TensorFlow) before the first one starts, and
        report every bad one at once: a bad value must not cancel a sweep half-way, or be found only
        after other jobs trained. Only for bwopt's own task (tests launch tasks of their own)."""
        from bwopt.sweep.sweeper import exit_if_refused, refusal, runs_bwopt

        if runs_bwopt(self.task_function):  # the repeats have the first round's overrides
            exit_if_refused([(job.num, job.overrides, refusal(job.config)) for job in jobs if not job.repeat])

    def _run_all(self, jobs: List[Job], sweep_dir: Path, returns: Dict[int, JobReturn]) -> None:
        """Start jobs in order, at most max_parallel at a time; on Ctrl-C or SIGTERM stop them and re-raise."""
        from bwopt.signals import STOP  # set by the first signal to `python -m bwopt`

        pending, running = deque(jobs), []
        with tempfile.TemporaryDirectory(prefix="bwopt-sweep-") as scratch:
            try:
                with STOP.deferred():  # the first signal is seen here, between two polls
                    while pending or running:
                        if STOP.requested:
                            raise KeyboardInterrupt(f"sweep stopped by {STOP.requested}")
                        while pending and len(running) < self.max_parallel:
                            running.append(self._start(pending.popleft(), Path(scratch), sweep_dir))
                        for ended in [item for item in running if item.process.poll() is not None]:
                            running.remove(ended)
                            returns[ended.job.num] = self._collect(ended)
                        time.sleep(POLL_INTERVAL_S)
            except KeyboardInterrupt:
                STOP.finishing = True  # a second signal now kills the jobs; a third stops the report
                self._stop(running, signal.Signals[STOP.requested or "SIGINT"])
                for ended in running:
                    returns[ended.job.num] = self._collect(ended)
                raise

    def _start(self, job: Job, scratch: Path, sweep_dir: Path) -> RunningJob:
        repeat = f"  (repeat {job.repeat + 1}/{self.repeats})" if self.repeats > 1 else ""
        log.info(f"\t#{job.num} : {' '.join(filter_overrides(job.overrides))}{repeat}")
        job_file, result_file = scratch / f"{job.num}.job.pkl", scratch / f"{job.num}.result.pkl"
        state = {
            "singleton_state": Singleton.get_state(),
            "hydra_context": self.hydra_context,
            "task_function": self.task_function,
            "config": job.config,
        }
        # sys.path first, so the child can import whatever module holds the task function
        job_file.write_bytes(pickle.dumps((list(sys.path), _dumps(state))))
        env = {**os.environ, "BWOPT_SWEEP_DIR": str(sweep_dir.resolve())}
        env.pop("BWOPT_PARENT_RUN_ID", None)
        env["BWOPT_SWEPT_KEYS"] = json.dumps(self._named_by)  # bwopt.tracking.names.run_name
        if self.parent is not None:
            env["BWOPT_PARENT_RUN_ID"] = self.parent.run_id
        from bwopt.signals import die_with_this_process

        process = subprocess.Popen(
            [sys.executable, "-m", "bwopt.sweep.job", str(job_file), str(result_file)],
            env=env,
            start_new_session=True,  # Ctrl-C goes to the launcher, which stops the job once
            preexec_fn=die_with_this_process(signal.SIGTERM),  # a killed launcher's job stops, its run KILLED
        )
        return RunningJob(job, process, result_file, time.monotonic(), time.time())

    def _collect(self, ended: RunningJob) -> JobReturn:
        """The job's JobReturn; a failed one when its process died without handing back its outcome."""
        job, exit_code = ended.job, ended.process.wait()
        outcome = {
            "status": "FAILED",
            "return_value": JobCrashed(f"job #{job.num} ({shown(job.overrides)}) {how_it_ended(exit_code)}"),
            "working_dir": os.getcwd(),
        }
        if ended.result_file.is_file():
            outcome = pickle.loads(ended.result_file.read_bytes())
        task_config = OmegaConf.masked_copy(job.config, [key for key in job.config if key != "hydra"])
        result = JobReturn(
            overrides=job.overrides,
            cfg=task_config,
            hydra_cfg=OmegaConf.create({"hydra": job.config.hydra}),
            working_dir=outcome["working_dir"],
            task_name=job.config.hydra.job.name,
            status=JobStatus[outcome["status"]],
            _return_value=outcome["return_value"],
        )
        job.folder.mkdir(parents=True, exist_ok=True)
        record = {"num": job.num, "repeat": job.repeat, "overrides": job.overrides, "exit_code": exit_code}
        record.update(status=result.status.name, started_at=ended.started_at)
        record["wall_s"] = round(time.monotonic() - ended.started_s, 3)
        if result.status is not JobStatus.COMPLETED:
            log.error(f"\t{describe_failure(job.num, job.overrides, result._return_value)}")
            record["mlflow_run"] = self._run_left_behind(ended, exit_code)
        (job.folder / "job.json").write_text(json.dumps(record, indent=2))
        return result

    def _run_left_behind(self, ended: RunningJob, exit_code: int) -> Optional[dict]:
        """A failed job's MLflow run when it wrote no summary.json: marked KILLED if the job was killed
        (it could not end its run itself), and what it recorded, for the report (bwopt.sweep.results)."""
        if self.config.tracking.name != "mlflow":
            return None
        from bwopt.tracking.runs import reap_runs
        from bwopt.tracking.sweeps import job_run_figures

        if exit_code < 0:
            reap_runs(self.config.tracking)
        if self.parent is None or (ended.job.folder / "summary.json").is_file():
            return None
        return job_run_figures(self.config.tracking, self.parent.run_id, ended.process.pid)

    def _stop(self, running: List[RunningJob], signum: signal.Signals) -> None:
        """Ask running jobs to stop (they end their runs KILLED); kill them after stop_timeout_s or a second signal."""
        for item in running:
            item.process.send_signal(signum)
        deadline = time.monotonic() + self.stop_timeout_s
        try:
            for item in running:
                item.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            for item in running:
                if item.process.poll() is None:
                    item.process.kill()
                    item.process.wait()

    def _start_parent(self, job_overrides: Sequence[Sequence[str]], sweep_dir: Path) -> None:
        """With tracking=mlflow, one parent run for the whole sweep (kept across Hydra's batches)."""
        if self.config.tracking.name != "mlflow":
            return
        from bwopt.sweep.parent import sweep_name
        from bwopt.tracking import ParentRun

        if self.parent is None:
            name = self.parent_name or sweep_name(job_overrides)
            self.parent = ParentRun.start(self.config.tracking, name, sweep_dir)
        else:
            self.parent.resume()

    def _finish(self, sweep_dir: Path, status: str) -> None:
        from bwopt.sweep.sweeper import finish_sweep

        finish_sweep(sweep_dir, self.parent, status, self.log_ranking)


def _dumps(state: dict) -> bytes:
    # Hydra's resolvers include lambdas, which pickle cannot name; cloudpickle (an MLflow dependency,
    # and what submitit uses for the same state) can.
    import cloudpickle

    return cloudpickle.dumps(state)
