"""The sweep report: every job of a sweep folder side by side, ranked by the objective (throughput).

Read from the sweep folder alone, so it can be written again at any time:
`python -m bwopt.sweep.report SWEEP_DIR`, or from an MLflow parent run:
`python -m bwopt.sweep.report --tracking-uri URI --parent-run-id ID [--output DIR]`.

A job is a folder `<sweep dir>/<n>/` holding `.hydra/overrides.yaml` (its overrides), `summary.json`
(what bwopt measured) and `job.json` (written by bwopt's launcher: repeat, exit code). A job failed
when it has no summary.json or its status is not FINISHED. Jobs with the same overrides are repeats
of one override set: the set's throughput is the median of its finished repeats, its spread their
min-max. Written into the sweep folder:

- `report.md`: the best overrides, the override sets ranked by median throughput, then every job;
- `report.csv`: one row per job, a column per swept key and per figure;
- `throughput.png`: throughput per job, split into the share of step time spent waiting for input
  and the rest; `throughput_vs_<key>.png` for each swept numeric key: median throughput against
  its value, the repeats' min-max as error bars.
"""

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

# (column, where in summary.json) for the key figures of a job, in table order
FIGURES = {
    "throughput_examples_per_s": "figures",
    "input_wait_fraction": "figures",
    "step_time_p50_s": "figures",
    "step_time_p99_s": "figures",
    "input_bound_verdict": "figures",
    "efficiency": "measurements",
    "peak_host_rss_bytes": "measurements",
    "val_accuracy": "final_metrics",
}
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

    @property
    def failed(self) -> bool:
        return self.status != "FINISHED"

    @property
    def throughput(self) -> Optional[float]:
        return None if self.failed else self.figures.get("throughput_examples_per_s")


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

    def median_of(self, name: str):
        """A figure's median over the finished repeats (the most common value for text figures)."""
        values = [job.figures[name] for job in self.jobs if not job.failed and job.figures.get(name) is not None]
        if not values:
            return None
        if all(isinstance(value, (int, float)) for value in values):
            return statistics.median(values)
        return max(set(values), key=values.count)


@dataclass
class Report:
    sweep_dir: Path
    jobs: List[JobResult]  # best first, failures last
    sets: List[OverrideSet]  # best median first, failed sets last
    swept_keys: List[str]
    summary: str = ""  # Markdown: the best overrides, the tables of override sets and of jobs
    files: List[Path] = field(default_factory=list)

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
    def best(self) -> Optional[OverrideSet]:
        return None if not self.sets or self.sets[0].failed else self.sets[0]

    @property
    def markdown_file(self) -> Path:
        return self.sweep_dir / "report.md"


def read_job(folder: Path) -> JobResult:
    overrides_file = folder / ".hydra" / "overrides.yaml"
    launcher_file, summary_file = folder / "job.json", folder / "summary.json"
    launched = json.loads(launcher_file.read_text()) if launcher_file.is_file() else {}
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else launched.get("overrides")
    job = JobResult(folder.name, list(overrides or []), NO_SUMMARY, exit_code=launched.get("exit_code"))
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        job.status, job.run_id = summary["status"], summary["run_id"]
        job.num_replicas = summary.get("num_replicas")
        for name, section in FIGURES.items():
            value = (summary.get(section) or {}).get(name)  # figures is null when nothing was timed
            if value is not None:
                job.figures[name] = value
    return job


def read_jobs(sweep_dir: Path) -> List[JobResult]:
    """Every job folder of the sweep, in folder-number order."""
    marks = (".hydra", "summary.json", "job.json")
    folders = [path for path in sweep_dir.iterdir() if path.is_dir() and any((path / mark).exists() for mark in marks)]
    folders.sort(key=lambda path: (not path.name.isdigit(), int(path.name) if path.name.isdigit() else 0, path.name))
    return [read_job(folder) for folder in folders]


def _ranked(throughput: Optional[float]) -> tuple:
    return (throughput is None, -(throughput or 0.0))


def build_report(sweep_dir: Path) -> Report:
    jobs = read_jobs(sweep_dir)
    sets: Dict[tuple, OverrideSet] = {}
    for job in jobs:
        sets.setdefault(tuple(job.overrides), OverrideSet(job.overrides, [])).jobs.append(job)
    ranked_sets = sorted(sets.values(), key=lambda item: _ranked(item.median))
    ranked_jobs = sorted(jobs, key=lambda job: _ranked(job.throughput))
    return Report(sweep_dir, ranked_jobs, ranked_sets, swept_keys(jobs))


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


def _shown(overrides: Sequence[str], keys: Sequence[str]) -> str:
    values = override_values(overrides)
    return " ".join(f"{key}={values[key]}" for key in keys if key in values) or "(none)"


def _number(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _figure_cells(figures) -> List[str]:
    """Input wait, p50, p99, verdict, efficiency, peak RSS, val accuracy, as table cells."""

    def scaled(name, factor, digits):
        value = figures(name)
        return _number(None if value is None else value * factor, digits)

    return [
        scaled("input_wait_fraction", 100, 1),
        scaled("step_time_p50_s", 1e3, 3),
        scaled("step_time_p99_s", 1e3, 3),
        figures("input_bound_verdict") or "",
        scaled("efficiency", 100, 1),
        scaled("peak_host_rss_bytes", 2**-20, 1),
        _number(figures("val_accuracy"), 4),
    ]


FIGURE_HEADERS = ["input wait %", "p50 ms", "p99 ms", "verdict", "efficiency %", "peak RSS MiB", "val acc"]


def _table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def sets_table(report: Report) -> str:
    headers = ["rank", "overrides", "runs ok", "throughput median (examples/s)", "min–max", *FIGURE_HEADERS, "jobs"]
    scaling = report.scaling
    if scaling:
        headers.insert(5, "replicas, scaling efficiency %")
    rows = []
    for rank, item in enumerate(report.sets, start=1):
        ok = len(item.throughputs)
        spread = f"{_number(min(item.throughputs))}–{_number(max(item.throughputs))}" if ok else ""
        rows.append(
            [
                str(rank) if not item.failed else "—",
                f"`{_shown(item.overrides, report.swept_keys)}`",
                f"{ok}/{len(item.jobs)}" + ("" if ok == len(item.jobs) else " **FAILED**" if item.failed else " ⚠"),
                _number(item.median),
                spread,
                *([_scaling_cell(item, scaling)] if scaling else []),
                *_figure_cells(item.median_of),
                ", ".join(
                    job.name for job in sorted(item.jobs, key=lambda job: int(job.name) if job.name.isdigit() else 0)
                ),
            ]
        )
    return _table(headers, rows)


def _scaling_cell(item: OverrideSet, scaling: Dict[int, float]) -> str:
    replicas = {job.num_replicas for job in item.jobs if not job.failed}
    if len(replicas) != 1 or next(iter(replicas)) not in scaling:
        return ""
    (count,) = replicas
    return f"{count}: {_number(100 * scaling[count])}"


def scaling_table(report: Report) -> str:
    """Replicas → median throughput and scaling efficiency = throughput at N ÷ (N × throughput at 1)."""
    rows = []
    for count, efficiency in report.scaling.items():
        throughputs = [job.throughput for job in report.jobs if job.num_replicas == count and job.throughput]
        rows.append([str(count), _number(statistics.median(throughputs)), _number(100 * efficiency)])
    return _table(["replicas", "throughput median (examples/s)", "scaling efficiency %"], rows)


def jobs_table(report: Report) -> str:
    headers = ["job", "overrides", "status", "throughput (examples/s)", *FIGURE_HEADERS, "MLflow run"]
    rows = []
    for job in report.jobs:
        status = job.status if not job.failed else f"**{job.status}**"
        if job.failed and job.exit_code not in (None, 0):
            status += f" (exit code {job.exit_code})"
        cells = _figure_cells(lambda name, job=job: None if job.failed else job.figures.get(name))
        row = [job.name, f"`{_shown(job.overrides, report.swept_keys)}`", status, _number(job.throughput)]
        rows.append([*row, *cells, job.run_id or ""])
    return _table(headers, rows)


def best_line(report: Report) -> str:
    common = [
        override
        for override in (report.jobs[0].overrides if report.jobs else [])
        if override.partition("=")[0] not in report.swept_keys
    ]
    line = "**No job finished.**"
    if report.best:
        best = report.best
        runs = f"{len(best.throughputs)} run{'s' if len(best.throughputs) > 1 else ''}"
        overrides = " ".join(best.overrides) or "(defaults)"
        line = f"**Best overrides:** `{overrides}`: {_number(best.median)} examples/s (median of {runs})"
    failed = sum(job.failed for job in report.jobs)
    line += f"\n\n{len(report.jobs)} jobs, {failed} failed."
    if common:
        line += f" Every job also had `{' '.join(common)}`."
    return line


def markdown(report: Report) -> str:
    return "\n\n".join(
        [
            f"# Sweep report: {report.sweep_dir}",
            best_line(report),
            "## Override sets, by median throughput",
            sets_table(report),
            *(["## Scaling", scaling_table(report)] if report.scaling else []),
            "## Jobs, by throughput",
            jobs_table(report),
            "Plots: " + ", ".join(f"![{path.stem}]({path.name})" for path in report.files if path.suffix == ".png"),
        ]
    )


def write_csv(report: Report, path: Path) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            ["job", "status", "exit_code", "run_id", "num_replicas", "overrides", *report.swept_keys, *FIGURES]
        )
        for job in report.jobs:
            values = override_values(job.overrides)
            swept = [values.get(key, "") for key in report.swept_keys]
            figures = ["" if job.figures.get(name) is None else job.figures[name] for name in FIGURES]
            exit_code = "" if job.exit_code is None else job.exit_code
            replicas = "" if job.num_replicas is None else job.num_replicas
            writer.writerow(
                [job.name, job.status, exit_code, job.run_id or "", replicas, " ".join(job.overrides), *swept, *figures]
            )


def write_report(sweep_dir: Path) -> Report:
    """Read the sweep folder and write report.md, report.csv and the plots into it."""
    from bwopt.sweep.plots import plot_parameters, plot_scaling, plot_throughput

    sweep_dir = Path(sweep_dir)
    report = build_report(sweep_dir)
    write_csv(report, sweep_dir / "report.csv")
    plots = [plot_throughput(report, sweep_dir / "throughput.png"), *plot_parameters(report, sweep_dir)]
    if report.scaling:
        plots.append(plot_scaling(report, sweep_dir / "scaling_efficiency.png"))
    report.files = [report.markdown_file, sweep_dir / "report.csv", *plots]
    report.summary = "\n\n".join([best_line(report), sets_table(report), jobs_table(report)])
    report.markdown_file.write_text(markdown(report) + "\n")
    return report


def download_sweep(tracking_uri: str, parent_run_id: str, output: Path) -> Path:
    """The children of an MLflow parent run as job folders (summary.json, .hydra/overrides.yaml) under output."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    for number, child in enumerate(children):
        folder = output / str(number)
        (folder / ".hydra").mkdir(parents=True, exist_ok=True)
        for artifact in ("summary.json", ".hydra/overrides.yaml"):
            try:  # MLflow writes the file into the folder given, under its base name
                client.download_artifacts(child.info.run_id, artifact, str((folder / artifact).parent))
            except Exception as error:  # a child that died before logging it is reported as such
                print(f"bwopt: warning: run {child.info.run_id} has no {artifact}: {error}", file=sys.stderr)
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bwopt.sweep.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", nargs="?", type=Path, help="a sweep folder, e.g. outputs/multirun/DATE/TIME")
    parser.add_argument("--tracking-uri", help="MLflow store of the parent run")
    parser.add_argument("--parent-run-id", help="the sweep's MLflow parent run")
    parser.add_argument("--output", type=Path, help="folder for the report of a parent run (default: sweep-<id>)")
    arguments = parser.parse_args(argv)
    if arguments.parent_run_id:
        if not arguments.tracking_uri:
            parser.error("--parent-run-id needs --tracking-uri")
        output = arguments.output or Path(f"sweep-{arguments.parent_run_id}")
        sweep_dir = download_sweep(arguments.tracking_uri, arguments.parent_run_id, output)
    elif arguments.sweep_dir:
        sweep_dir = arguments.sweep_dir
        if not sweep_dir.is_dir():
            parser.error(f"{sweep_dir} is not a folder")
    else:
        parser.error("give a sweep folder, or --tracking-uri and --parent-run-id")
    report = write_report(sweep_dir)
    print(report.summary)
    print(f"\nwritten: {', '.join(str(path) for path in report.files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
