"""The sweep report: a sweep's results (bwopt.sweep.results) rendered as Markdown, CSV and plots.

Read from the sweep folder alone, so it can be written again at any time:
`python -m bwopt.sweep.report SWEEP_DIR`, or from an MLflow parent run:
`python -m bwopt.sweep.report --tracking-uri URI --parent-run-id ID [--output DIR]`.

Written into the sweep folder:

- `report.md`: the best overrides, the override sets ranked as compared (by the geometric mean of
  their repeats' throughputs; the table shows the median), then every job;
  a job (and its override set) whose val_accuracy is more than `sweep.accuracy_tolerance` below the
  best job's is marked "learned worse" (column "val acc vs best") and never named best;
- `report.csv`: one row per job, a column per swept key and per figure;
- the plots of bwopt.sweep.plots: `throughput.png`, `throughput_vs_<key>.png` for each swept
  numeric key, and `scaling_efficiency.png` when the jobs ran at several replica counts.
"""

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.sweep.plots import write_plots
from bwopt.sweep.results import FIGURES, OverrideSet, SweepResults, folder_order, override_values, read_results


@dataclass
class Report(SweepResults):
    """A sweep's results as written into its folder: the files (report.md, report.csv, the plots) and the summary."""

    summary: str = ""  # Markdown: the best overrides, the tables of override sets and of jobs
    files: List[Path] = field(default_factory=list)

    @property
    def markdown_file(self) -> Path:
        return self.sweep_dir / "report.md"

    def parent_figures(self) -> tuple:
        """(metrics, params) for the sweep's MLflow parent run, so that the runs table and the chart
        view show sweeps without unfolding them: the leader's median throughput (and, when it beats
        the runner-up beyond the noise, `best_found` 1), the number of jobs and of failed jobs;
        the swept keys and the values they took, in launch order."""
        metrics: Dict[str, float] = {
            "num_jobs": len(self.jobs),
            "num_failed_jobs": sum(job.failed for job in self.jobs),
        }
        if self.best is not None:
            metrics["throughput_examples_per_s"] = float(self.best.median)
            metrics["best_found"] = float(self.ranking.best is not None)
        params = {}
        for key in self.swept_keys:
            values = []
            for job in sorted(self.jobs, key=lambda job: folder_order(job.name)):  # as launched, not as ranked
                value = override_values(job.overrides).get(key)
                if value is not None and value not in values:
                    values.append(value)
            params[f"swept.{key.lstrip('+~')}"] = ",".join(values)[:500]  # MLflow's keys allow no + or ~
        if self.best is not None:
            params["leader"] = self.label(self.best)[:500]
        return metrics, params


def _shown(overrides: Sequence[str], keys: Sequence[str]) -> str:
    values = override_values(overrides)
    return " ".join(f"{key}={values[key]}" for key in keys if key in values) or "(none)"


def _number(value, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _figure_cells(figures) -> List[str]:
    """Input wait, p50, p99, time in slow episodes, verdict, efficiency, peak RSS, val accuracy, as table cells."""

    def scaled(name, factor, digits):
        value = figures(name)
        return _number(None if value is None else value * factor, digits)

    return [
        scaled("input_wait_fraction", 100, 1),
        scaled("step_time_p50_s", 1e3, 3),
        scaled("step_time_p99_s", 1e3, 3),
        scaled("slow_time_fraction", 100, 0),
        figures("verdict") or figures("input_bound_verdict") or "",
        scaled("efficiency", 100, 1),
        scaled("peak_host_rss_bytes", 2**-20, 1),
        _number(figures("val_accuracy"), 4),
    ]


FIGURE_HEADERS = ["input wait %", "p50 ms", "p99 ms", "slow %", "verdict", "efficiency %", "peak RSS MiB", "val acc"]
LEARNED_WORSE = "learned worse"


def _accuracy_cell(results: SweepResults, item, accuracy: Optional[float]) -> str:
    """The accuracy's difference from the sweep's best, marked when the job or set learned worse."""
    best = results.best_accuracy
    if best is None or accuracy is None:
        return ""
    gap = f"{accuracy - best:+.4f}"
    return f"**{gap} {LEARNED_WORSE}**" if results.learned_worse(item) else gap


def _table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def sets_table(results: SweepResults) -> str:
    headers = ["rank", "overrides", "runs ok", "throughput median (examples/s)", "min–max", *FIGURE_HEADERS]
    headers += ["val acc vs best", "vs the leader (95 % CI)", "jobs"]
    scaling = results.scaling
    against = results.ranking.against_leader
    if scaling:
        headers.insert(5, "replicas, scaling efficiency %")
    rows = []
    for rank, item in enumerate(results.sets, start=1):
        ok = len(item.throughputs)
        spread = f"{_number(min(item.throughputs))}–{_number(max(item.throughputs))}" if ok else ""
        rows.append(
            [
                str(rank) if not item.failed else "—",
                f"`{_shown(item.overrides, results.swept_keys)}`",
                f"{ok}/{len(item.jobs)}" + ("" if ok == len(item.jobs) else " **FAILED**" if item.failed else " ⚠"),
                _number(item.median),
                spread,
                *([_scaling_cell(item, scaling)] if scaling else []),
                *_figure_cells(item.median_of),
                _accuracy_cell(results, item, item.median_of("val_accuracy")),
                _comparison_cell(against.get(results.label(item)), item is results.best),
                ", ".join(job.name for job in sorted(item.jobs, key=_job_number)),
            ]
        )
    return _table(headers, rows)


def _comparison_cell(comparison, leader: bool) -> str:
    """'×0.52 (×0.48–×0.57) slower' against the leader; 'leader' for the leader itself."""
    if leader:
        return "leader"
    if comparison is None:
        return ""
    low, high = comparison.ci95
    return f"×{comparison.ratio:.2f} (×{low:.2f}–×{high:.2f}) {comparison.word}"


def _job_number(job) -> int:
    return int(job.name) if job.name.isdigit() else 0


def _scaling_cell(item: OverrideSet, scaling: Dict[int, float]) -> str:
    replicas = {job.num_replicas for job in item.jobs if not job.failed}
    if len(replicas) != 1 or next(iter(replicas)) not in scaling:
        return ""
    (count,) = replicas
    return f"{count}: {_number(100 * scaling[count])}"


def scaling_table(results: SweepResults) -> str:
    """Replicas → median throughput and scaling efficiency = throughput at N ÷ (N × throughput at 1)."""
    rows = []
    for count, efficiency in results.scaling.items():
        throughputs = [job.throughput for job in results.jobs if job.num_replicas == count and job.throughput]
        rows.append([str(count), _number(statistics.median(throughputs)), _number(100 * efficiency)])
    return _table(["replicas", "throughput median (examples/s)", "scaling efficiency %"], rows)


def jobs_table(results: SweepResults) -> str:
    headers = ["job", "overrides", "status", "throughput (examples/s)", *FIGURE_HEADERS]
    headers += ["val acc vs best", "MLflow run"]
    rows = []
    for job in results.jobs:
        status = job.status if not job.failed else f"**{job.status}**"
        if job.failed and job.exit_code not in (None, 0):
            status += f" (exit code {job.exit_code})"
        shown = job.from_mlflow or not job.failed  # a failed job's figures only from its MLflow run, marked
        if job.from_mlflow:
            status += ": figures from its MLflow run, not counted"
        cells = _figure_cells(lambda name, job=job: job.figures.get(name) if shown else None)
        throughput = job.recorded_throughput if shown else None
        row = [job.name, f"`{_shown(job.overrides, results.swept_keys)}`", status, _number(throughput)]
        rows.append([*row, *cells, _accuracy_cell(results, job, job.val_accuracy), job.run_id or ""])
    return _table(headers, rows)


def best_line(results: SweepResults) -> str:
    common = [
        override
        for override in (results.jobs[0].overrides if results.jobs else [])
        if override.partition("=")[0] not in results.swept_keys
    ]
    finished = any(not item.failed for item in results.sets)
    line = "**No override set finished without learning worse.**" if finished else "**No job finished.**"
    if results.best:
        best, ranking = results.best, results.ranking
        runs = f"{len(best.throughputs)} run{'s' if len(best.throughputs) > 1 else ''}"
        overrides = " ".join(best.overrides) or "(defaults)"
        title = "Best overrides" if ranking.best else "Fastest overrides, not beyond the noise"
        line = f"**{ranking.sentence}**\n\n**{title}:** `{overrides}`: {_number(best.median)} examples/s"
        line += f" (median of {runs})"
    failed = sum(job.failed for job in results.jobs)
    line += f"\n\n{len(results.jobs)} jobs, {failed} failed."
    if common:
        line += f" Every job also had `{' '.join(common)}`."
    return line + learned_worse_line(results)


def learned_worse_line(results: SweepResults) -> str:
    """The sentence that names the jobs that learned worse ('' when none did)."""
    worse = sorted((job for job in results.jobs if results.learned_worse(job)), key=_job_number)
    if not worse:
        return ""
    named = ", ".join(
        f"{job.name} (`{_shown(job.overrides, results.swept_keys)}`: {job.val_accuracy:.4f})" for job in worse
    )
    fastest = next((item for item in results.sets if not item.failed), None)
    line = (
        f"\n\n**{len(worse)} job{'s' if len(worse) > 1 else ''} {LEARNED_WORSE}**: validation accuracy more than "
        f"{results.accuracy_tolerance:g} (sweep.accuracy_tolerance) below the best, {results.best_accuracy:.4f}: "
        f"{named}. Input settings should change how fast the model is fed, not what it learns; "
        "no override set with such a job is named best."
    )
    if fastest is not None and results.learned_worse(fastest):
        line += f" The fastest, `{' '.join(fastest.overrides) or '(defaults)'}`, is one of them."
    return line


def markdown(results: SweepResults, plots: Sequence[Path]) -> str:
    return "\n\n".join(
        [
            f"# Sweep report: {results.sweep_dir}",
            best_line(results),
            "## Override sets, fastest first (by the geometric mean of their repeats, as compared)",
            sets_table(results),
            *(["## Scaling", scaling_table(results)] if results.scaling else []),
            "## Jobs, by throughput",
            jobs_table(results),
            "Plots: " + ", ".join(f"![{path.stem}]({path.name})" for path in plots),
        ]
    )


def write_csv(results: SweepResults, path: Path) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            ["job", "status", "exit_code", "run_id", "num_replicas", "overrides", *results.swept_keys, *FIGURES]
            + ["learned_worse"]
        )
        for job in results.jobs:
            values = override_values(job.overrides)
            swept = [values.get(key, "") for key in results.swept_keys]
            figures = ["" if job.figures.get(name) is None else job.figures[name] for name in FIGURES]
            exit_code = "" if job.exit_code is None else job.exit_code
            replicas = "" if job.num_replicas is None else job.num_replicas
            row = [job.name, job.status, exit_code, job.run_id or "", replicas, " ".join(job.overrides), *swept]
            writer.writerow([*row, *figures, str(results.learned_worse(job)).lower()])


def write_report(sweep_dir: Path) -> Report:
    """Read the sweep folder and write report.md, report.csv and the plots into it."""
    results = read_results(sweep_dir)
    folder = results.sweep_dir
    write_csv(results, folder / "report.csv")
    plots = write_plots(results, folder)
    summary = "\n\n".join([best_line(results), sets_table(results), jobs_table(results)])
    files = [folder / "report.md", folder / "report.csv", *plots]
    report = Report(
        folder, results.jobs, results.sets, results.swept_keys, results.accuracy_tolerance, summary=summary, files=files
    )
    report.markdown_file.write_text(markdown(results, plots) + "\n")
    return report


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
        from bwopt.tracking import download_sweep

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
