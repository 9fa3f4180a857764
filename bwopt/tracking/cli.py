"""`python -m bwopt.tracking reap URI [EXPERIMENT]` | `python -m bwopt.tracking complete RUN_FOLDER`."""

import argparse
from pathlib import Path
from typing import Optional, Sequence

from bwopt.tracking.runs import complete
from bwopt.tracking.store import client_for, reap_dead_runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bwopt.tracking", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    reap = commands.add_parser("reap", help="mark RUNNING runs of dead processes on this host KILLED")
    reap.add_argument("tracking_uri")
    reap.add_argument("experiment", nargs="?", default="bwopt")
    finish = commands.add_parser("complete", help="log a run folder's summary.json to its MLflow run")
    finish.add_argument("run_folder", type=Path)
    arguments = parser.parse_args(argv)
    if arguments.command == "complete":
        print(f"bwopt: completed MLflow run {complete(arguments.run_folder)}")
        return 0
    client = client_for(arguments.tracking_uri)
    experiment = client.get_experiment_by_name(arguments.experiment)
    reaped = reap_dead_runs(client, [experiment.experiment_id]) if experiment else []
    print(f"bwopt: marked {len(reaped)} run(s) KILLED" + "".join(f"\n  {run_id}" for run_id in reaped))
    return 0
