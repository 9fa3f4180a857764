"""The tuner with its plan given in advance, for tests of its loop (the probe and the cost model that
make the plan are tested apart, in test_tune_decide.py and test_tune_probe.py)."""

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
