"""The name of a sweep's MLflow parent run (the run itself: bwopt.tracking.sweeps.ParentRun), and the
keys a sweep varies, which its jobs' runs are named by."""

from typing import Dict, List, Sequence

from hydra.core.utils import filter_overrides


def _values(job_overrides: Sequence[Sequence[str]]) -> Dict[str, List[str]]:
    """Each override key (as typed) -> its values across the jobs, in first-seen order."""
    values: Dict[str, List[str]] = {}
    for overrides in job_overrides:
        for override in filter_overrides(overrides):
            key, _, value = override.partition("=")
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    return values


def varied_keys(job_overrides: Sequence[Sequence[str]]) -> List[str]:
    """The override keys whose value changes across the jobs (or that only some jobs have)."""
    values = _values(job_overrides)
    present = [{override.partition("=")[0] for override in filter_overrides(overrides)} for overrides in job_overrides]
    return [key for key, choices in values.items() if len(choices) > 1 or any(key not in keys for keys in present)]


def sweep_name(job_overrides: Sequence[Sequence[str]]) -> str:
    """'sweep pipeline.prefetch=0,2': the keys whose value changes across the jobs, with their values
    (bwopt.tracking.ParentRun adds the time it starts)."""
    values = _values(job_overrides)
    swept = [f"{key}={','.join(values[key])}" for key in varied_keys(job_overrides)]
    return "sweep " + (" ".join(swept) or " ".join(filter_overrides(job_overrides[0])) or "(defaults)")
