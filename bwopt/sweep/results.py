"""A sweep's results, read from its folder: the jobs and their figures, folded by override set and ranked.

A job is a folder `<sweep dir>/<n>/` holding `.hydra/overrides.yaml` (its overrides), `summary.json`
(what bwopt measured) and `job.json` (written by bwopt's launcher: repeat, exit code). A job failed
when it has no summary.json, its status is not FINISHED or its process did not exit 0. A job
without summary.json shows what its MLflow run recorded, when the launcher found one (KILLED
after a signal), and is still never ranked nor in a median. Jobs with the same overrides are repeats
of one override set: the set's throughput is the median of its finished repeats, its spread their
min-max. The objective is throughput: jobs and sets are ranked by it, best first, failures last.

Speed must not cost learning: a finished job whose final `val_accuracy` is more than
`sweep.accuracy_tolerance` (absolute; read from the first job's `.hydra/config.yaml`, else the
schema's default) below the highest of the sweep learned worse, and so does every override set
holding such a job. A set that learned worse is never the best, however fast.

The report (bwopt.sweep.report), its plots (bwopt.sweep.plots) and the search (bwopt.sweep.search)
read results from here; this module imports nothing else of bwopt.sweep.
"""

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

from bwopt.schema import SweepConfig

# (figure, its section in summary.json) for the key figures of a job, in table order
FIGURES = {
    "throughput_examples_per_s": "figures",
    "input_wait_fraction": "figures",
    "step_time_p50_s": "figures",
    "step_time_p99_s": "figures",
    "slow_time_fraction": "figures",
    "input_bound_verdict": "figures",
    "verdict": "figures",
    "efficiency": "measurements",
    "peak_host_rss_bytes": "measurements",
    "val_accuracy": "final_metrics",
}
SUMMARY_SECTIONS = ("figures", "measurements", "final_metrics")
NO_SUMMARY = "NO SUMMARY"


@dataclass
class JobResult:
    """One job folder. status: FINISHED, FAILED, KILLED, or NO SUMMARY (the process died before writing one)."""

    name: str
    overrides: List[str]
    status: str
    run_id: Optional[str] = None
    figures: Dict[str, object] = field(default_factory=dict)
    exit_code: Optional[int] = None
    num_replicas: Optional[int] = None
    throughput_ci95: Optional[List[float]] = None  # the run's own 95 % interval, when it measured one
    from_mlflow: bool = False  # no summary.json: the figures are what its MLflow run recorded

    @property
    def recorded_throughput(self) -> Optional[float]:
        """The throughput the job recorded, finished or not (a failed job's is never ranked)."""
        return self.figures.get("throughput_examples_per_s")

    @property
    def failed(self) -> bool:
        return self.status != "FINISHED"

    @property
    def throughput(self) -> Optional[float]:
        return None if self.failed else self.figures.get("throughput_examples_per_s")

    @property
    def val_accuracy(self) -> Optional[float]:
        value = None if self.failed else self.figures.get("val_accuracy")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class OverrideSet:
    """The repeats of one set of overrides, folded."""

    overrides: List[str]
    jobs: List[JobResult]

    @property
    def throughputs(self) -> List[float]:
        return [job.throughput for job in self.jobs if job.throughput is not None]

    @property
    def failed(self) -> bool:
        return not self.throughputs

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.throughputs) if self.throughputs else None

    @property
    def geometric_mean(self) -> Optional[float]:
        """exp(mean log throughput) of the finished repeats: the estimate sets are ranked and compared by
        (bwopt.sweep.compare), which the median can order differently from 3 repeats on."""
        values = self.throughputs
        return math.exp(sum(math.log(value) for value in values) / len(values)) if values else None

    def median_of(self, name: str):
        """A figure's median over the finished repeats (the most common value for text figures)."""
        values = [job.figures[name] for job in self.jobs if not job.failed and job.figures.get(name) is not None]
        if not values:
            return None
        if all(isinstance(value, (int, float)) for value in values):
            return statistics.median(values)
        return max(set(values), key=values.count)


@dataclass
class SweepResults:
    """Every job of one sweep folder, and its override sets."""

    sweep_dir: Path
    jobs: List[JobResult]  # best first, failures last
    sets: List[OverrideSet]  # fastest first by geometric mean (as compared), failed sets last
    swept_keys: List[str]
    accuracy_tolerance: float  # sweep.accuracy_tolerance

    @property
    def scaling(self) -> Dict[int, float]:
        """Scaling efficiency by replica count (bwopt.measure.scaling), when jobs ran at 1 and more replicas."""
        from bwopt.measure.scaling import scaling_efficiency

        finished = [job for job in self.jobs if job.throughput is not None]
        efficiency = scaling_efficiency(
            [
                {"num_replicas": job.num_replicas, "figures": {"throughput_examples_per_s": job.throughput}}
                for job in finished
            ]
        )
        return efficiency if len(efficiency) > 1 else {}

    @property
    def best_accuracy(self) -> Optional[float]:
        """The highest final val_accuracy of a finished job (None when no job reports one)."""
        accuracies = [job.val_accuracy for job in self.jobs if job.val_accuracy is not None]
        return max(accuracies) if accuracies else None

    def learned_worse(self, item) -> bool:
        """Whether a job, or an override set (any of its jobs), is more than the tolerance below the best accuracy."""
        if isinstance(item, OverrideSet):
            return any(self.learned_worse(job) for job in item.jobs)
        best, accuracy = self.best_accuracy, item.val_accuracy
        # the margin keeps a difference of exactly the tolerance (0.90 vs 0.87) from rounding into a flag
        return best is not None and accuracy is not None and best - accuracy > self.accuracy_tolerance + 1e-9

    @property
    def best(self) -> Optional[OverrideSet]:
        """The leader: of the sets that finished and did not learn worse, the one `ranking` puts
        first (the highest mean log throughput, the estimate its comparisons use); `ranking` says
        whether it is faster than the runner-up beyond the noise."""
        eligible = self.eligible
        if not eligible:
            return None
        leader = self.ranking.order[0]
        return next(item for item in eligible if self.label(item) == leader)

    @property
    def eligible(self) -> List[OverrideSet]:
        """The sets that finished and did not learn worse, fastest first (the table's order)."""
        return [item for item in self.sets if not item.failed and not self.learned_worse(item)]

    def label(self, item: OverrideSet) -> str:
        """The set's swept values, as the report shows them ('(defaults)' when none)."""
        values = override_values(item.overrides)
        return " ".join(f"{key}={values[key]}" for key in self.swept_keys if key in values) or "(defaults)"

    @property
    def ranking(self):
        """bwopt.sweep.compare.Ranking of the eligible sets: each against the leader, with its interval."""
        from bwopt.sweep.compare import rank

        measured = {}
        for item in self.eligible:
            finished = [job for job in item.jobs if job.throughput is not None]
            measured[self.label(item)] = (
                [job.throughput for job in finished],
                [job.throughput_ci95 for job in finished],
            )
        return rank(measured)


def read_summary(folder: Path) -> Optional[dict]:
    """The job folder's summary.json, or None when the job wrote none."""
    summary_file = folder / "summary.json"
    return json.loads(summary_file.read_text()) if summary_file.is_file() else None


def summary_value(folder: Path, name: str) -> Optional[float]:
    """A numeric figure of the job's summary.json by name, from any of its sections; None when it has none."""
    summary = read_summary(folder) or {}
    for section in SUMMARY_SECTIONS:
        value = (summary.get(section) or {}).get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def read_job(folder: Path) -> JobResult:
    overrides_file, launcher_file = folder / ".hydra" / "overrides.yaml", folder / "job.json"
    launched = json.loads(launcher_file.read_text()) if launcher_file.is_file() else {}
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else launched.get("overrides")
    job = JobResult(folder.name, list(overrides or []), NO_SUMMARY, exit_code=launched.get("exit_code"))
    summary = read_summary(folder)
    if summary is not None:
        job.status, job.run_id = summary["status"], summary["run_id"]
        job.num_replicas = summary.get("num_replicas")
        for name, section in FIGURES.items():
            value = (summary.get(section) or {}).get(name)  # figures is null when nothing was timed
            if value is not None:
                job.figures[name] = value
        job.throughput_ci95 = (summary.get("figures") or {}).get("throughput_examples_per_s_ci95")
    elif launched.get("mlflow_run"):
        recover_from_run(job, launched["mlflow_run"])
    if job.status == "FINISHED" and job.exit_code not in (None, 0):  # killed after it wrote its summary
        job.status = "FAILED"
    return job


def recover_from_run(job: JobResult, run: dict) -> None:
    """The figures a job without summary.json recorded in its MLflow run (`job.json`'s `mlflow_run`,
    written by bwopt's launcher), back in summary.json's units; the final figure where the run logged
    one, else its last epoch's (`epoch/...`). The job stays failed: KILLED when a signal ended it."""
    from bwopt.tracking.names import readable_name

    job.run_id, job.from_mlflow = run.get("run_id"), True
    job.status = "KILLED" if (job.exit_code or 0) < 0 or run.get("status") == "KILLED" else "FAILED"
    metrics = run.get("metrics") or {}
    for name in FIGURES:
        metric, factor = readable_name(name)
        value = metrics.get(metric, metrics.get(f"epoch/{metric}"))
        if value is not None:
            job.figures[name] = value / factor
    if run.get("verdict"):
        job.figures["verdict"] = run["verdict"]
    low, high = (metrics.get(f"throughput_examples_per_s_ci95_{end}") for end in ("low", "high"))
    job.throughput_ci95 = [low, high] if None not in (low, high) else None


def job_folders(sweep_dir: Path) -> List[Path]:
    """Every job folder of the sweep, in folder-number order."""
    marks = (".hydra", "summary.json", "job.json")
    folders = [path for path in sweep_dir.iterdir() if path.is_dir() and any((path / mark).exists() for mark in marks)]
    folders.sort(key=lambda path: folder_order(path.name))
    return folders


def folder_order(name: str) -> tuple:
    """Sort key for job folder names: numbered folders first, by number (the order Hydra launched them)."""
    return (not name.isdigit(), int(name) if name.isdigit() else 0, name)


def read_jobs(sweep_dir: Path) -> List[JobResult]:
    """Every job folder of the sweep, in folder-number order."""
    return [read_job(folder) for folder in job_folders(sweep_dir)]


def accuracy_tolerance(sweep_dir: Path) -> float:
    """sweep.accuracy_tolerance as the sweep's first job ran with it (.hydra/config.yaml), else the schema default."""
    for folder in job_folders(sweep_dir):
        config_file = folder / ".hydra" / "config.yaml"
        if config_file.is_file():
            value = ((yaml.safe_load(config_file.read_text()) or {}).get("sweep") or {}).get("accuracy_tolerance")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            break
    return SweepConfig().accuracy_tolerance


def _ranked(throughput: Optional[float]) -> tuple:
    return (throughput is None, -(throughput or 0.0))


def read_results(sweep_dir: Path) -> SweepResults:
    """The sweep folder's jobs and override sets, each ranked by throughput."""
    sweep_dir = Path(sweep_dir)
    jobs = read_jobs(sweep_dir)
    sets: Dict[tuple, OverrideSet] = {}
    for job in jobs:
        sets.setdefault(tuple(job.overrides), OverrideSet(job.overrides, [])).jobs.append(job)
    ranked_sets = sorted(sets.values(), key=lambda item: _ranked(item.geometric_mean))
    ranked_jobs = sorted(jobs, key=lambda job: _ranked(job.throughput))
    return SweepResults(sweep_dir, ranked_jobs, ranked_sets, swept_keys(jobs), accuracy_tolerance(sweep_dir))


def swept_keys(jobs: Sequence[JobResult]) -> List[str]:
    """Override keys whose value differs across the jobs (or that some jobs lack), in first-seen order."""
    values: Dict[str, set] = {}
    for job in jobs:
        for key, value in override_values(job.overrides).items():
            values.setdefault(key, set()).add(value)
    return [
        key
        for key, seen in values.items()
        if len(seen) > 1 or any(key not in override_values(job.overrides) for job in jobs)
    ]


def override_values(overrides: Sequence[str]) -> Dict[str, str]:
    """['a.b=1', '+c=x'] -> {'a.b': '1', '+c': 'x'}."""
    return dict(override.partition("=")[::2] for override in overrides)


def median_objective(objectives: Sequence[float]) -> float:
    """The median of a set's repeats; NaN (a repeat that timed nothing) is left out, as the median
    would otherwise place it by its position in the list; NaN when no repeat measured anything."""
    measured = [value for value in objectives if not math.isnan(value)]
    return statistics.median(measured) if measured else math.nan
