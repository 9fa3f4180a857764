"""bwopt's Optuna sweeper in this process, its trials through bwopt's launcher on a task without TensorFlow."""

import json

import optuna
import pytest
import sweep_tasks
import yaml
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.types import HydraContext, RunMode
from mlflow import MlflowClient
from optuna.trial import TrialState

from bwopt.app import config_dir
from bwopt.sweep.search import SearchConfigError, override_value, search_space

SLOW = pytest.mark.slow  # every trial is a fresh process


def search(sweep_dir, arguments, *overrides):
    """Compose the real conf/ with bwopt's sweeper and search `arguments` on sweep_tasks.scored."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        config = hydra.compose_config(
            "config",
            [f"hydra.sweep.dir={sweep_dir}", "hydra/sweeper=bwopt_optuna", *overrides],
            run_mode=RunMode.MULTIRUN,
        )
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
        sweeper = Plugins.instance().instantiate_sweeper(
            hydra_context=context, task_function=sweep_tasks.scored, config=config
        )
        return sweeper.sweep(arguments=list(arguments))


@SLOW
def test_failed_trials_are_told_failed_and_the_study_resumes_from_storage(tmp_path, mlflow_uri):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = ["hydra.sweeper.study_name=resume", f"hydra.sweeper.storage={storage}", "hydra.sweeper.seed=3"]
    space = ["+throughput=choice(-1,0,100,200,300)", "+accuracy=0.9"]
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=search"]
    first = search(tmp_path / "first", space, "hydra.sweeper.n_trials=5", *study, *tracking)

    trials = optuna.load_study(study_name="resume", storage=storage).trials
    assert [trial.number for trial in trials] == [0, 1, 2, 3, 4]
    for trial in trials:  # -1 raises, 0 measures nothing (NaN): both FAILED, the study goes on
        throughput = trial.params["+throughput"]
        assert trial.state is (TrialState.COMPLETE if throughput > 0 else TrialState.FAIL), trial
        assert trial.state is TrialState.FAIL or trial.values == [throughput]
        assert (tmp_path / "first" / str(trial.number) / "job.json").is_file()  # folder n is trial n
    completed = [trial for trial in trials if trial.state is TrialState.COMPLETE]
    assert completed, "seed 3 should draw a throughput > 0 in 5 trials"
    best = max(completed, key=lambda trial: trial.values[0])
    written = yaml.safe_load((tmp_path / "first" / "search.yaml").read_text())
    assert written == first
    assert written["num_trials"] == 5 and written["num_failed"] == 5 - len(completed)
    (only,) = written["best"]
    assert only["trial"] == best.number and only["values"] == {"throughput_examples_per_s": best.values[0]}
    assert only["overrides"] == ["+accuracy=0.9", f"+throughput={best.params['+throughput']}"]

    client = MlflowClient(tracking_uri=mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("search").experiment_id])
    assert parent.info.run_name == "search resume" and parent.data.tags["bwopt.study_name"] == "resume"
    assert "search.yaml" in {item.path for item in client.list_artifacts(parent.info.run_id)}

    # A second invocation adds its trials to the stored study, numbered on, each in its own folder.
    search(tmp_path / "second", space, "hydra.sweeper.n_trials=2", *study, "tracking=none")
    trials = optuna.load_study(study_name="resume", storage=storage).trials
    assert [trial.number for trial in trials] == [0, 1, 2, 3, 4, 5, 6]
    assert all(trial.state in (TrialState.COMPLETE, TrialState.FAIL) for trial in trials)
    assert {path.name for path in (tmp_path / "second").iterdir() if path.is_dir()} == {"5", "6"}


@SLOW
def test_a_second_objective_from_summary_json_gives_a_pareto_front(tmp_path):
    arguments = ["+throughput=choice(100,200)", "+accuracy=choice(0.5,0.9)"]
    objectives = ["hydra.sweeper.objectives=[throughput_examples_per_s,val_accuracy]"]
    directions = ["hydra.sweeper.directions=[maximize,maximize]", "hydra.sweeper.sampler=random"]
    results = search(
        tmp_path / "sweep", arguments, "hydra.sweeper.n_trials=4", "tracking=none", *objectives, *directions
    )
    assert results["num_complete"] == 4
    measured = {}  # trial number -> (throughput, val_accuracy) as its job wrote them
    for folder in (tmp_path / "sweep").iterdir():
        if folder.is_dir():
            summary = json.loads((folder / "summary.json").read_text())
            measured[int(folder.name)] = (
                summary["figures"]["throughput_examples_per_s"],
                summary["final_metrics"]["val_accuracy"],
            )

    def dominated(point):
        return any(other != point and all(o >= p for o, p in zip(other, point)) for other in measured.values())

    assert {item["trial"] for item in results["best"]} == {n for n, point in measured.items() if not dominated(point)}
    for item in results["best"]:
        values = item["values"]
        assert (values["throughput_examples_per_s"], values["val_accuracy"]) == measured[item["trial"]]


def test_the_search_space_is_hydra_sweep_syntax():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    fixed, space = search_space(
        {"pipeline.prefetch": "choice(0, 2, autotune)", "train.epochs": "3"},
        [
            "pipeline.cache=off,memory",
            "train.learning_rate=tag(log, interval(0.0001, 0.1))",
            "pipeline.options.private_threadpool_size=range(0,5,2)",
            "train.epochs=1",
            "+x=tag(int, interval(1, 8))",
        ],
    )
    assert fixed == ["train.epochs=1"]  # the command line wins over params
    assert space["pipeline.prefetch"] == CategoricalDistribution([0, 2, "autotune"])
    assert space["pipeline.cache"] == CategoricalDistribution(["off", "memory"])
    assert space["train.learning_rate"] == FloatDistribution(0.0001, 0.1, log=True)
    assert space["pipeline.options.private_threadpool_size"] == IntDistribution(0, 4, step=2)
    assert space["+x"] == IntDistribution(1, 8)
    assert [override_value(v) for v in (True, None, "autotune", 0.5, "a b")] == [
        "true",
        "null",
        "autotune",
        "0.5",
        "'a b'",
    ]
    with pytest.raises(SearchConfigError, match="nothing to search"):
        search_space({}, ["train.epochs=1"])
    with pytest.raises(SearchConfigError, match="only choice"):
        search_space({}, ["pipeline.prefetch=glob(*)"])


@SLOW
def test_a_search_where_no_trial_finished_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="no trial of study 'bwopt' finished"):
        space = ["+throughput=choice(-1,0)", "+accuracy=0.9"]
        search(tmp_path / "sweep", space, "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler=random", "tracking=none")
    written = yaml.safe_load((tmp_path / "sweep" / "search.yaml").read_text())
    assert written["num_failed"] == 2 and written["best"] == []


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"objectives": ["throughput_examples_per_s", "val_accuracy"]}, "one direction per objective"),
        ({"directions": ["up"]}, "each is maximize or minimize"),
        ({"sampler": "grid"}, "expected one of tpe, random"),
        ({"n_trials": 0}, "must both be >= 1"),
    ],
)
def test_bad_sweeper_settings_name_the_key(settings, message):
    from bwopt.sweep.search import BwoptSweeperConf, OptunaSearch

    defaults = {key: value for key, value in vars(BwoptSweeperConf()).items() if key != "_target_"}
    with pytest.raises(SearchConfigError, match=message):
        OptunaSearch(**{**defaults, **settings})
