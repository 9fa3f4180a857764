"""The sweep's results and report on hand-made job folders (no TensorFlow, no launcher)."""

import csv
import json

import pytest
import yaml
from PIL import Image

from bwopt.schema import SweepConfig
from bwopt.sweep.report import main, write_report
from bwopt.sweep.results import read_results, swept_keys

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_job(
    sweep, number, overrides, status="FINISHED", throughput=None, input_wait=0.5, exit_code=0, replicas=1, slow=0.0
):
    """A job folder as bwopt's launcher and runner leave it; status None: no summary.json at all."""
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "job.json").write_text(json.dumps({"num": number, "overrides": overrides, "exit_code": exit_code}))
    if status is None:
        return
    figures = None
    if throughput is not None:
        figures = {
            "throughput_examples_per_s": throughput,
            "throughput_examples_per_s_ci95": [0.95 * throughput, 1.05 * throughput],  # as every run records it
            "input_wait_fraction": input_wait,
            "step_time_p50_s": 0.002,
            "step_time_p99_s": 0.004,
            "slow_time_fraction": slow,  # share of the timed window in slow episodes
            "input_bound_verdict": "highly input-bound",
        }
    summary = {
        "run_id": f"run{number}",
        "status": status,
        "mode": "train",
        "num_replicas": replicas,
        "devices": ["/device:CPU:0"] * replicas,
        "figures": figures,
        "measurements": {"peak_host_rss_bytes": 2**30, "efficiency": 0.5},
        "final_metrics": {"val_accuracy": 0.9},
    }
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path):
    """prefetch 0, 2, 4 twice over (interleaved), plus a crashed and a failed job of prefetch=8."""
    sweep = tmp_path / "sweep"
    common = ["train.epochs=1"]
    throughputs = {"0": [100.0, 120.0], "2": [300.0, 200.0], "4": [250.0, 260.0]}
    for repeat in range(2):
        for index, prefetch in enumerate(throughputs):
            make_job(
                sweep,
                repeat * 4 + index,
                [f"pipeline.prefetch={prefetch}", *common],
                throughput=throughputs[prefetch][repeat],
                slow=0.31 if throughputs[prefetch][repeat] == 200.0 else 0.0,  # the low repeat held an episode
            )
    make_job(sweep, 3, ["pipeline.prefetch=8", *common], status=None, exit_code=-9)
    make_job(sweep, 7, ["pipeline.prefetch=8", *common], status="FAILED", exit_code=1)
    return sweep


def test_repeats_fold_into_median_and_spread_ranked_by_throughput(sweep):
    report = read_results(sweep)
    assert swept_keys(report.jobs) == ["pipeline.prefetch"]
    assert [item.overrides[0] for item in report.sets] == [f"pipeline.prefetch={p}" for p in ("4", "2", "0", "8")]
    assert [item.median for item in report.sets] == [255.0, 250.0, 110.0, None]
    assert [(min(item.throughputs), max(item.throughputs)) for item in report.sets[:3]] == [
        (250, 260),
        (200, 300),
        (100, 120),
    ]
    assert report.sets[-1].failed and report.best.overrides == ["pipeline.prefetch=4", "train.epochs=1"]
    assert [job.name for job in report.jobs] == ["1", "6", "2", "5", "4", "0", "3", "7"]
    assert [job.status for job in report.jobs[-2:]] == ["NO SUMMARY", "FAILED"]


def test_files_name_the_best_mark_the_failures_and_plot_every_numeric_key(sweep):
    report = write_report(sweep)
    text = (sweep / "report.md").read_text()
    # prefetch=4 (250, 260) leads prefetch=2 (300, 200) by its median only: inside the noise, no best.
    assert "**No best: pipeline.prefetch=4 and pipeline.prefetch=2 tie (pipeline.prefetch=4 vs" in text
    assert "repeats per setting would resolve a difference this size (hydra.launcher.repeats).**" in text
    assert (
        "**Fastest overrides, not beyond the noise:** `pipeline.prefetch=4 train.epochs=1`: 255.0 examples/s "
        "(median of 2 runs)" in text
    )
    # prefetch=0 (100, 120) is slower than the leader beyond the noise, and says so with its interval.
    (row,) = [line for line in text.splitlines() if line.startswith("| 3 | `pipeline.prefetch=0`")]
    assert "×0.43 (×" in row and ") slower |" in row
    assert "8 jobs, 2 failed. Every job also had `train.epochs=1`." in text
    assert (
        "| 1 | `pipeline.prefetch=4` | 2/2 | 255.0 | 250.0–260.0 | 50.0 | 2.000 | 4.000 | 0 | highly input-bound |"
        in text
    )
    assert "| 5 | `pipeline.prefetch=2` | FINISHED | 200.0 | 50.0 | 2.000 | 4.000 | 31 | highly input-bound |" in text
    assert "| — | `pipeline.prefetch=8` | 0/2 **FAILED** |" in text
    assert "| 3 | `pipeline.prefetch=8` | **NO SUMMARY** (exit code -9) |" in text
    assert "| 7 | `pipeline.prefetch=8` | **FAILED** (exit code 1) |" in text
    with (sweep / "report.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["job"] for row in rows] == ["1", "6", "2", "5", "4", "0", "3", "7"]
    assert rows[0]["pipeline.prefetch"] == "2" and float(rows[0]["throughput_examples_per_s"]) == 300.0
    assert rows[-2]["status"] == "NO SUMMARY" and rows[-2]["throughput_examples_per_s"] == ""
    plots = [sweep / "throughput.png", sweep / "throughput_vs_pipeline.prefetch.png"]
    assert [path for path in report.files if path.suffix == ".png"] == plots
    for path in plots:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 200


def test_non_numeric_keys_get_no_line_plot_and_a_sweep_with_no_success_has_no_best(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["pipeline=naive"], status="FAILED")
    make_job(sweep, 1, ["pipeline=tuned"], status="FINISHED", throughput=None)  # nothing timed: figures null
    report = write_report(sweep)
    assert report.best is None and all(job.throughput is None for job in report.jobs)
    assert "**No job finished.**" in report.summary
    assert [path.name for path in report.files if path.suffix == ".png"] == ["throughput.png"]


def test_the_command_regenerates_the_report_from_a_sweep_folder(sweep, capsys):
    assert main([str(sweep)]) == 0
    assert "Fastest overrides, not beyond the noise" in capsys.readouterr().out
    assert (sweep / "report.md").is_file() and (sweep / "report.csv").is_file()


def test_the_command_rebuilds_a_sweep_from_an_mlflow_parent_run(sweep, tmp_path, mlflow_client, mlflow_uri):
    experiment = mlflow_client.create_experiment("report_from_parent", artifact_location=(tmp_path / "art").as_uri())
    parent = mlflow_client.create_run(experiment, run_name="sweep pipeline.prefetch=0,2").info.run_id
    for number in (0, 1):
        child = mlflow_client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
        mlflow_client.log_artifact(child, str(sweep / str(number) / "summary.json"))
        mlflow_client.log_artifacts(child, str(sweep / str(number) / ".hydra"), ".hydra")
    output = tmp_path / "from_parent"
    assert main(["--tracking-uri", mlflow_uri, "--parent-run-id", parent, "--output", str(output)]) == 0
    report = read_results(output)
    assert [job.overrides[0] for job in report.jobs] == ["pipeline.prefetch=2", "pipeline.prefetch=0"]
    assert (output / "report.md").is_file()


def test_a_sweep_over_replicas_reports_scaling_efficiency_in_its_table_and_a_plot(tmp_path):
    sweep = tmp_path / "scaling"
    for number, (replicas, throughput) in enumerate([(1, 1000.0), (2, 1500.0), (4, 2000.0)]):
        make_job(sweep, number, [f"device.num_cpu_devices={replicas}"], throughput=throughput, replicas=replicas)
    report = write_report(sweep)
    assert report.scaling == {1: 1.0, 2: 0.75, 4: 0.5}
    text = (sweep / "report.md").read_text()
    assert "## Scaling" in text and "| 4 | 2,000.0 | 50.0 |" in text and "| 2 | 1,500.0 | 75.0 |" in text
    assert "2: 75.0" in text  # the override sets' table names each set's replicas and efficiency
    assert (sweep / "scaling_efficiency.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    assert sorted(row["num_replicas"] for row in rows) == ["1", "2", "4"]


def set_accuracy(sweep, number, accuracy):
    """The job's final val_accuracy in its summary.json (None: the job reports none, as mode=input)."""
    summary_file = sweep / str(number) / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["final_metrics"] = {} if accuracy is None else {"val_accuracy": accuracy}
    summary_file.write_text(json.dumps(summary))


def write_config(sweep, number, tolerance):
    """The job's resolved config as Hydra saves it (.hydra/config.yaml), with sweep.accuracy_tolerance."""
    config = {"seed": 0, "sweep": {"accuracy_tolerance": tolerance}}
    (sweep / str(number) / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture
def accuracies(tmp_path):
    """The fastest pipeline learned worse: tuned 300/s at 0.70, default 200/s at 0.975, naive 100/s at 0.99."""
    sweep = tmp_path / "accuracies"
    for number, (pipeline, throughput, accuracy) in enumerate(
        [("naive", 100.0, 0.99), ("tuned", 300.0, 0.70), ("default", 200.0, 0.975)]
    ):
        make_job(sweep, number, [f"pipeline={pipeline}", "seed=0"], throughput=throughput)
        set_accuracy(sweep, number, accuracy)
    return sweep


def test_a_job_that_learned_worse_is_flagged_and_never_named_best(accuracies):
    results = read_results(accuracies)
    assert results.accuracy_tolerance == SweepConfig().accuracy_tolerance == 0.03  # no config.yaml: the default
    assert results.best_accuracy == 0.99
    assert [results.learned_worse(job) for job in results.jobs] == [True, False, False]  # tuned, default, naive
    assert [item.overrides[0] for item in results.sets] == ["pipeline=tuned", "pipeline=default", "pipeline=naive"]
    assert results.learned_worse(results.sets[0]) and results.best.overrides == ["pipeline=default", "seed=0"]

    report = write_report(accuracies)
    text = (accuracies / "report.md").read_text()
    assert "**Best overrides:** `pipeline=default seed=0`: 200.0 examples/s (median of 1 run)" in text
    assert (
        "**1 job learned worse**: validation accuracy more than 0.03 (sweep.accuracy_tolerance) below the best, "
        "0.9900: 1 (`pipeline=tuned`: 0.7000)." in text
    )
    assert "The fastest, `pipeline=tuned seed=0`, is one of them." in report.summary
    assert "| 1 | `pipeline=tuned` | 1/1 | 300.0 |" in text and "| 0.7000 | **-0.2900 learned worse** |" in text
    assert "| 0.9750 | -0.0150 | leader | 2 |" in text  # default: within the tolerance, no flag
    rows = {row["job"]: row for row in csv.DictReader((accuracies / "report.csv").open())}
    assert [rows[name]["learned_worse"] for name in ("0", "1", "2")] == ["false", "true", "false"]


def test_the_tolerance_is_the_first_jobs_and_a_difference_of_exactly_it_is_no_flag(accuracies):
    write_config(accuracies, 0, 0.5)
    results = read_results(accuracies)
    assert results.accuracy_tolerance == 0.5 and not any(results.learned_worse(job) for job in results.jobs)
    assert results.best.overrides == ["pipeline=tuned", "seed=0"]
    assert "learned worse" not in write_report(accuracies).summary

    write_config(accuracies, 0, 0.01)  # default (0.975) is 0.015 below naive now: flagged too
    results = read_results(accuracies)
    assert [job.overrides[0] for job in results.jobs if results.learned_worse(job)] == [
        "pipeline=tuned",
        "pipeline=default",
    ]
    assert results.best.overrides == ["pipeline=naive", "seed=0"]

    write_config(accuracies, 0, 0.03)
    set_accuracy(accuracies, 2, 0.96)  # exactly 0.03 below 0.99: not more than the tolerance
    assert read_results(accuracies).best.overrides == ["pipeline=default", "seed=0"]


def test_an_override_set_with_one_repeat_that_learned_worse_is_flagged(tmp_path):
    sweep = tmp_path / "repeats"
    for number, (prefetch, throughput, accuracy) in enumerate(
        [(0, 100.0, 0.95), (2, 300.0, 0.95), (0, 110.0, 0.94), (2, 310.0, 0.5)]
    ):
        make_job(sweep, number, [f"pipeline.prefetch={prefetch}"], throughput=throughput)
        set_accuracy(sweep, number, accuracy)
    results = read_results(sweep)
    fast, slow = results.sets
    assert fast.overrides == ["pipeline.prefetch=2"] and results.learned_worse(fast) and not results.learned_worse(slow)
    assert results.best is slow
    text = write_report(sweep).summary
    assert "**1 job learned worse**" in text and "3 (`pipeline.prefetch=2`: 0.5000)" in text
    assert "| 2 | `pipeline.prefetch=0` | 2/2 | 105.0 |" in text


def test_jobs_without_an_accuracy_are_never_flagged(tmp_path):
    sweep = tmp_path / "input_mode"
    for number, (prefetch, accuracy) in enumerate([(0, None), (2, None), (4, 0.5)]):
        make_job(sweep, number, [f"pipeline.prefetch={prefetch}"], throughput=100.0 * (number + 1))
        set_accuracy(sweep, number, accuracy)
    results = read_results(sweep)
    assert results.best_accuracy == 0.5 and not any(results.learned_worse(job) for job in results.jobs)
    assert results.best.overrides == ["pipeline.prefetch=4"]
    assert "learned worse" not in write_report(sweep).summary


def test_every_override_set_that_finished_learned_worse_leaves_no_best(tmp_path):
    sweep = tmp_path / "all_worse"
    for number, accuracy in enumerate([0.9, 0.5]):  # two repeats of one set: its best and its worst
        make_job(sweep, number, ["pipeline=tuned"], throughput=100.0)
        set_accuracy(sweep, number, accuracy)
    results = read_results(sweep)
    assert results.best is None
    assert "**No override set finished without learning worse.**" in write_report(sweep).summary


@pytest.mark.parametrize("tolerance", [-0.01, 1.5])
def test_the_tolerance_is_an_accuracy_difference_in_0_1(tolerance):
    from conftest import compose_config

    from bwopt.app import validate
    from bwopt.schema import ConfigError

    assert validate(compose_config(["sweep.accuracy_tolerance=1"])).sweep.accuracy_tolerance == 1.0
    with pytest.raises(
        ConfigError, match=r"sweep.accuracy_tolerance=.* expected an absolute accuracy difference in \[0, 1\]"
    ):
        validate(compose_config([f"sweep.accuracy_tolerance={tolerance}"]))


def test_the_parent_run_shows_the_sweep_in_mlflows_tables_with_its_sentence_first(sweep, mlflow_client, mlflow_uri):
    from bwopt.schema import MlflowTracking
    from bwopt.tracking import ParentRun

    report = write_report(sweep)
    parent = ParentRun.start(MlflowTracking(uri=mlflow_uri, experiment="parent_figures"), "sweep prefetch", sweep)
    parent.end("FINISHED", report)
    run = mlflow_client.get_run(parent.run_id)
    assert run.data.metrics["num_jobs"] == 8 and run.data.metrics["num_failed_jobs"] == 2
    assert run.data.metrics["throughput_examples_per_s"] == 255.0 and run.data.metrics["best_found"] == 0.0
    assert run.data.params["swept.pipeline.prefetch"] == "0,2,4,8"  # as launched, whatever the ranking
    assert run.data.params["leader"] == "pipeline.prefetch=4"
    assert run.data.tags["mlflow.note.content"].startswith("**No best: pipeline.prefetch=4 and pipeline.prefetch=2 tie")


def test_the_leader_is_the_set_the_comparison_puts_first_even_where_the_medians_disagree(tmp_path):
    sweep = tmp_path / "sweep"
    throughputs = {"0": [100.0, 300.0, 310.0], "2": [280.0, 290.0, 285.0]}  # medians 300 and 285
    for repeat in range(3):
        for index, prefetch in enumerate(throughputs):
            make_job(
                sweep, repeat * 2 + index, [f"pipeline.prefetch={prefetch}"], throughput=throughputs[prefetch][repeat]
            )
    report = write_report(sweep)
    assert report.ranking.order[0] == "pipeline.prefetch=2"  # mean log: 285 against 210
    assert report.best.overrides == ["pipeline.prefetch=2"]
    assert report.parent_figures()[1]["leader"] == "pipeline.prefetch=2"
    # and the table ranks it first too, beside its median
    assert [item.overrides for item in report.sets] == [["pipeline.prefetch=2"], ["pipeline.prefetch=0"]]
    table = (sweep / "report.md").read_text().split("## Override sets")[1]
    first_row = next(line for line in table.splitlines() if line.startswith("| 1 |"))
    assert "pipeline.prefetch=2" in first_row and "285" in first_row


def test_the_verdict_column_is_the_runs_verdict_not_the_input_wait_class(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["pipeline.prefetch=0"], throughput=100.0)
    make_job(sweep, 1, ["pipeline.prefetch=2"], throughput=200.0)
    summary_file = sweep / "1" / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["figures"]["verdict"] = "host-overhead-bound"  # its input wait alone read "highly input-bound"
    summary_file.write_text(json.dumps(summary))
    write_report(sweep)
    with open(sweep / "report.csv") as rows:
        verdicts = {row["pipeline.prefetch"]: row["verdict"] for row in csv.DictReader(rows)}
    markdown = (sweep / "report.md").read_text()
    assert verdicts["2"] == "host-overhead-bound" and "| host-overhead-bound |" in markdown
