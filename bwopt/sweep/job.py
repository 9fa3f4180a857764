"""One job of a sweep, in the fresh process bwopt's launcher starts: `python -m bwopt.sweep.job JOB RESULT`,
how the launcher tells how a job ended, and what it hands back to Hydra per override set.

JOB holds what Hydra's own launcher would pass to `run_job` in-process (see bwopt.sweep.launcher);
RESULT receives the job's status and return value. Exit code: 0 when the task completed, 1 when it
raised (the traceback is printed here, where it happened), the task's own code when it called
sys.exit, 128 + the signal's number when a signal stopped it (130 SIGINT, 143 SIGTERM, 129 SIGHUP;
its run ended KILLED, one line, no traceback).
"""

import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hydra.core.utils import JobReturn, JobStatus, filter_overrides

from bwopt.sweep.results import median_objective


class JobCrashed(RuntimeError):
    """A job's process ended without handing back its result."""


@dataclass
class FailedJobReturn(JobReturn):
    """A failed job's JobReturn; reading its `return_value` (as Hydra's sweepers do to fail a sweep)
    prints one line naming the first failed job of the batch and exits 1, instead of a traceback."""

    first_failure: str = ""

    @property
    def return_value(self):
        print(f"bwopt: sweep failed: {self.first_failure}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    @return_value.setter
    def return_value(self, value) -> None:
        self._return_value = value


def shown(overrides: Optional[Sequence[str]]) -> str:
    return " ".join(filter_overrides(list(overrides or []))) or "no overrides"


def how_it_ended(exit_code: int) -> str:
    """A job process's end, from its exit code."""
    if exit_code < 0:
        return f"was killed by {signal.Signals(-exit_code).name}"
    if exit_code - 128 in {int(signum) for signum in signal.Signals}:
        return f"was stopped by {signal.Signals(exit_code - 128).name} (exit code {exit_code})"
    return f"exited with code {exit_code} without a result"


def describe_failure(num: int, overrides: Optional[Sequence[str]], error) -> str:
    """One line: the job, its overrides and how it failed."""
    if isinstance(error, JobCrashed):
        return str(error)
    text = str(error).strip()
    return f"job #{num} ({shown(overrides)}) failed: {type(error).__name__}: {text.splitlines()[0] if text else ''}"


def per_override_set(sets: List[List[int]], returns: Dict[int, JobReturn], sweep_dir: Path) -> List[JobReturn]:
    """One JobReturn per override set, in Hydra's order (`sets`: each set's job numbers): a set whose
    repeats all completed returns the median of their objectives, otherwise its first failed repeat's
    JobReturn, which names the batch's first failure (bwopt.sweep.launcher)."""
    failures = {num: result for num, result in sorted(returns.items()) if result.status is not JobStatus.COMPLETED}
    first_failure = ""
    if failures:
        num, result = next(iter(failures.items()))
        first_failure = (
            f"{describe_failure(num, result.overrides, result._return_value)}; {len(failures)} of "
            f"{len(returns)} job(s) failed; see {sweep_dir / 'report.md'} and each job's folder"
        )
    folded = []
    for numbers in sets:
        results = [returns[num] for num in numbers]
        failed = [result for result in results if result.status is not JobStatus.COMPLETED]
        if failed:
            folded.append(FailedJobReturn(**vars(failed[0]), first_failure=first_failure))
            continue
        first = results[0]
        objectives = [result._return_value for result in results]
        if len(results) > 1 and all(isinstance(value, (int, float)) for value in objectives):
            first.return_value = median_objective(objectives)
        folded.append(first)
    return folded


def main(job_file: Path, result_file: Path) -> int:
    sys_path, state = pickle.loads(job_file.read_bytes())
    sys.path[:] = sys_path  # the parent's, so the task function's module imports here too

    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    from bwopt.signals import STOP

    STOP.install()  # as `python -m bwopt` does: a signal ends the run KILLED
    try:
        state = pickle.loads(state)
        Singleton.set_state(state["singleton_state"])
        setup_globals()
        result = run_job(
            hydra_context=state["hydra_context"],
            task_function=state["task_function"],
            config=state["config"],
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except KeyboardInterrupt:  # the run ended KILLED and printed what it measured
        print(f"bwopt: job stopped by {STOP.requested or 'SIGINT'}", file=sys.stderr, flush=True)
        return STOP.exit_code
    # The status and return value only: the launcher holds the job's config (whose pickled form names
    # classes that Hydra's plugin scan imported afresh here, so it would not load there).
    outcome = {"status": result.status.name, "return_value": result._return_value, "working_dir": result.working_dir}
    if result.status is JobStatus.COMPLETED:
        result_file.write_bytes(pickle.dumps(outcome))
        return 0
    error = result._return_value
    traceback.print_exception(type(error), error, error.__traceback__)
    try:
        result_file.write_bytes(pickle.dumps(outcome))
    except Exception:  # an exception that does not pickle still reaches the launcher, as text
        outcome["return_value"] = RuntimeError(f"{type(error).__name__}: {error}")
        result_file.write_bytes(pickle.dumps(outcome))
    return 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
