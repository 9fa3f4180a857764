"""`python -m bwopt -m ...` searches and preset sweeps as users run them: real TensorFlow jobs, each a fresh process."""

import json

import optuna
import pytest
import yaml
from conftest import experiment_presets, run_bwopt
from mlflow import MlflowClient
from optuna.trial import TrialState

pytestmark = pytest.mark.slow
TINY = ["train.epochs=1", "train.warmup_steps=2", "train.steps_per_epoch=6", "measure.memcpy_bandwidth=false"]


def sweep_dirs(cwd):
    return sorted((cwd / "outputs" / "multirun").glob("*/*"))


def test_a_three_trial_search_reports_its_best_overrides_and_resumes_from_storage(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    search = ["-m", "hparams_search=pipeline", f"hydra.sweeper.storage={storage}", *TINY]
    result = run_bwopt(*search, "hydra.sweeper.n_trials=3", "hydra.sweep.dir=outputs/multirun/first/0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "outputs" / "multirun" / "first" / "0"
    written = yaml.safe_load((sweep / "search.yaml").read_text())
    assert written["study_name"] == "pipeline" and written["num_trials"] == written["num_complete"] == 3
    (best,) = written["best"]
    summaries = {n: json.loads((sweep / str(n) / "summary.json").read_text()) for n in range(3)}
    throughputs = {n: summary["figures"]["throughput_examples_per_s"] for n, summary in summaries.items()}
    # the best trial is the fastest job, and its overrides are those the job ran with
    assert best["trial"] == max(throughputs, key=throughputs.get)
    assert best["values"]["throughput_examples_per_s"] == pytest.approx(throughputs[best["trial"]])
    ran_with = yaml.safe_load((sweep / str(best["trial"]) / ".hydra" / "overrides.yaml").read_text())
    assert best["overrides"] == ran_with and "hparams_search=pipeline" in ran_with
    assert len([override for override in ran_with if override.startswith("pipeline.")]) == 10
    assert "Best overrides (trial" in result.stdout + result.stderr

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bwopt")
    (parent,) = client.search_runs([experiment.experiment_id], "attributes.run_name LIKE 'search pipeline · %'")
    assert parent.info.status == "FINISHED" and parent.data.tags["bwopt.study_name"] == "pipeline"
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    for child in children:  # named by the searched keys alone: the fixed overrides are in a tag
        assert all(item.startswith("pipeline.") for item in child.info.run_name.split(","))
        assert "hparams_search" not in child.info.run_name and "hparams_search" in child.data.tags["bwopt.overrides"]
    # the best trial against the first (the default pipeline is not in this space): an interval and a word
    comparison = written["against_start"]
    assert comparison["word"] in ("faster", "slower", "no difference detected") and len(comparison["ci95"]) == 2
    assert parent.data.tags["mlflow.note.content"].startswith(f"**{comparison['sentence']}**")
    assert comparison["sentence"] in result.stdout + result.stderr
    assert sorted(child.info.run_id for child in children) == sorted(s["run_id"] for s in summaries.values())
    assert {"search.yaml", "report.md"} <= {item.path for item in client.list_artifacts(parent.info.run_id)}

    # A second invocation loads the study from storage and adds its trial to it.
    again = run_bwopt(
        *search, "hydra.sweeper.n_trials=1", "hydra.sweep.dir=outputs/multirun/second/0", "tracking=none", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    trials = optuna.load_study(study_name="pipeline", storage=storage).trials
    assert [trial.number for trial in trials] == [0, 1, 2, 3]
    assert trials[3].state is TrialState.COMPLETE
    assert (tmp_path / "outputs" / "multirun" / "second" / "0" / "3" / "summary.json").is_file()
    assert (
        yaml.safe_load((tmp_path / "outputs" / "multirun" / "second" / "0" / "search.yaml").read_text())["num_trials"]
        == 4
    )


def test_every_experiment_preset_runs_at_a_tiny_size_in_one_multirun(tmp_path):
    presets = experiment_presets()
    tiny = [*TINY, "measure.ceiling_steps=10", "tracking=none", "hydra.launcher.max_parallel=2"]
    result = run_bwopt("-m", "experiment=glob(*)", *tiny, cwd=tmp_path)
    (sweep,) = sweep_dirs(tmp_path)
    jobs = {}
    for folder in sorted(path for path in sweep.iterdir() if path.is_dir()):
        overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text())
        preset = next(o.partition("=")[2] for o in overrides if o.startswith("experiment="))
        summary_file = folder / "summary.json"
        jobs[preset] = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    assert sorted(jobs) == presets
    for preset, summary in jobs.items():
        if preset == "memory_growth" and (summary is None or summary["status"] != "FINISHED"):
            assert "sees no GPU" in result.stderr  # needs a GPU; elsewhere it fails with that message
            continue
        assert summary["status"] == "FINISHED" and summary["figures"]["num_timed_steps"] > 0, preset
    assert "measurements" in jobs["compression"] and jobs["compression"]["measurements"]["tfrecord_compression_ratio"]
