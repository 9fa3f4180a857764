"""One job of a sweep, in the fresh process bwopt's launcher starts: `python -m bwopt.sweep.job JOB RESULT`.

JOB holds what Hydra's own launcher would pass to `run_job` in-process (see bwopt.sweep.launcher);
RESULT receives the job's status and return value. Exit code: 0 when the task completed, 1 when it raised (the traceback
is printed here, where it happened), the task's own code when it called sys.exit.
"""

import pickle
import sys
import traceback
from pathlib import Path


def main(job_file: Path, result_file: Path) -> int:
    sys_path, state = pickle.loads(job_file.read_bytes())
    sys.path[:] = sys_path  # the parent's, so the task function's module imports here too

    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    from bwopt.signals import STOP

    STOP.install()  # as `python -m bwopt` does: SIGINT/SIGTERM end the run KILLED at a step boundary
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
