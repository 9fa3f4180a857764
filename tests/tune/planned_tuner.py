"""For tests of the tuner's loop: the tuner with its plan given in advance (the probe and the cost
model that make the plan are tested apart, in test_tune_decide.py and test_tune_probe.py), and a
job folder as a finished job leaves it, for launchers that script their runs."""

import json
from pathlib import Path

from bwopt.sweep.tune_plan import OPT_IN_NAMES
from hydra_plugins.bwopt_tuner.bwopt_tuner import BwoptTuner


class PlannedTuner(BwoptTuner):
    """tune whose proposals are `proposals`, in order, less those kept or rejected."""

    proposals = ()

    def _planner(self, base, start, budget):
        def next_proposal(kept, rejected, opt_in_only=False):
            left = [p for p in self.proposals if p.name not in (*kept, *rejected)]
            return next((p for p in left if not opt_in_only or p.name in OPT_IN_NAMES), None)

        return next_proposal


def write_job(sweep_dir: Path, index: int, overrides, figures: dict, measurements: dict) -> None:
    """Job folder `index` as a finished job leaves it: its summary and its job record."""
    folder = sweep_dir / str(index)
    folder.mkdir(parents=True)
    summary = {"status": "FINISHED", "run_id": None, "figures": figures, "measurements": measurements}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "job.json").write_text(json.dumps({"overrides": list(overrides), "exit_code": 0, "wall_s": 1.0}))
