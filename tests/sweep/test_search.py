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
from bwopt.sweep.search_start import best_trials, learned_worse
from bwopt.sweep.sweeper import SweepFailed

SLOW = pytest.mark.slow  # every trial is a fresh process


def search(sweep_dir, arguments, *overrides, task=sweep_tasks.scored):
    """Compose the real conf/ with bwopt's sweeper and search `arguments` on `task` (sweep_tasks.scored)."""
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        config = hydra.compose_config(
            "config",
            [f"hydra.sweep.dir={sweep_dir}", "hydra/sweeper=bwopt_optuna", *overrides],
            run_mode=RunMode.MULTIRUN,
        )
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(config))
        sweeper = Plugins.instance().instantiate_sweeper(hydra_context=context, task_function=task, config=config)
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
    assert parent.info.run_name.startswith("search resume · ") and parent.data.tags["bwopt.study_name"] == "resume"
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert children == []  # sweep_tasks.scored starts no run of its own
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
def test_a_search_where_no_trial_finished_is_an_error_in_one_line(tmp_path):
    # Python prints a SweepFailed's message alone, without a traceback, and exits 1
    with pytest.raises(SweepFailed, match="^bwopt: search failed: no trial of study 'bwopt' finished; "):
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
def test_bad_sweeper_settings_name_the_key_in_one_line_and_exit_2(settings, message, capsys):
    """Hydra wraps an error raised while it builds the sweeper in a traceback: the sweeper exits itself."""
    from bwopt.sweep.search import OptunaSearch

    with pytest.raises(SystemExit) as exited:  # the other keys keep BwoptSweeperConf's defaults
        OptunaSearch(**settings)
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("bwopt: invalid config: ") and message in line


def finished_study(points):
    """An in-memory study of finished trials, (values, val_accuracy or None) each, numbered in order."""
    study = optuna.create_study(directions=["maximize"] * len(points[0][0]))
    for values, accuracy in points:
        user_attrs = {} if accuracy is None else {"val_accuracy": accuracy}
        study.add_trial(optuna.trial.create_trial(values=values, user_attrs=user_attrs))
    return study.trials


def test_a_trial_more_than_the_tolerance_below_the_best_accuracy_learned_worse():
    trials = finished_study([([100.0], 0.99), ([300.0], 0.70), ([200.0], 0.96), ([250.0], None)])
    assert [trial.number for trial in learned_worse(trials, 0.03)] == [1]  # 0.96: exactly the tolerance, kept
    assert [trial.number for trial in learned_worse(trials, 0.02)] == [1, 2]
    assert learned_worse(trials, 1.0) == [] and learned_worse(trials[3:], 0.0) == []
    eligible = [trial for trial in trials if trial.number != 1]
    assert [trial.number for trial in best_trials(eligible, ["maximize"])] == [3]
    assert [trial.number for trial in best_trials(eligible, ["minimize"])] == [0]
    tie = finished_study([([1.0], None), ([1.0], None)])
    assert [trial.number for trial in best_trials(tie, ["maximize"])] == [0]  # the first of a tie, as Optuna


def test_the_pareto_front_matches_optunas():
    points = [([1.0, 1.0], None), ([2.0, 4.0], None), ([2.0, 3.0], None), ([0.5, 0.5], None), ([2.0, 4.0], None)]
    study = optuna.create_study(directions=["maximize", "minimize"])
    for trial in finished_study(points):
        study.add_trial(trial)
    front = best_trials(study.trials, ["maximize", "minimize"])
    assert sorted(trial.number for trial in front) == sorted(trial.number for trial in study.best_trials) == [0, 2, 3]


@SLOW
def test_the_search_never_picks_a_trial_that_learned_worse(tmp_path):
    arguments = ["+throughput=choice(100,200,300)", "+accuracy=choice(0.6,0.95)"]
    settings = ["hydra.sweeper.n_trials=5", "hydra.sweeper.sampler=random", "hydra.sweeper.seed=4", "tracking=none"]
    results = search(tmp_path / "sweep", arguments, *settings, "sweep.accuracy_tolerance=0.05")
    trials = {}  # trial number -> (throughput, val_accuracy) as its job measured them
    for folder in (tmp_path / "sweep").iterdir():
        if folder.is_dir():
            summary = json.loads((folder / "summary.json").read_text())
            figures, metrics = summary["figures"], summary["final_metrics"]
            trials[int(folder.name)] = (figures["throughput_examples_per_s"], metrics["val_accuracy"])
    fastest_accurate = max(throughput for throughput, accuracy in trials.values() if accuracy == 0.95)
    assert max(throughput for throughput, _ in trials.values()) > fastest_accurate, "seed 4: the fastest learned worse"
    (best,) = results["best"]
    assert best["val_accuracy"] == 0.95 and best["values"]["throughput_examples_per_s"] == fastest_accurate
    assert results["accuracy_tolerance"] == 0.05
    worse = sorted(number for number, (_, accuracy) in trials.items() if accuracy == 0.6)
    assert [item["trial"] for item in results["learned_worse"]] == worse
    assert yaml.safe_load((tmp_path / "sweep" / "search.yaml").read_text()) == results


@pytest.mark.parametrize(
    "sweep,message",
    [
        ("range(5,1)", "the range is empty or runs downwards; expected range(start, stop) with start < stop"),
        ("range(1,5,-1)", "the range is empty or runs downwards"),
        ("interval(5.0,1.0)", "the interval's low end 5 is above its high end 1"),
        ("tag(int, interval(8, 2))", "the interval's low end 8 is above its high end 2"),
        ("tag(log, interval(0, 0.1))", "a log interval must start above 0"),
        ("tag(log, interval(-1, 0.1))", "a log interval must start above 0"),
        ("tag(int, log, interval(0, 8))", "a log interval must start above 0"),
    ],
)
def test_a_space_that_cannot_be_searched_is_one_line_and_exit_2(tmp_path, sweep, message, capsys):
    with pytest.raises(SystemExit) as exited:
        search(tmp_path / "sweep", [f"+x={sweep}", "+throughput=1"], "tracking=none")
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"bwopt: invalid config: +x={sweep}: ") and message in line
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").iterdir())  # no trial ran


def test_the_best_trial_is_compared_with_the_start_with_an_interval_and_a_word():
    from bwopt.sweep.search_start import START, against_start

    def trial(value, start=False, half_width=0.02):
        attrs = {"throughput_examples_per_s_ci95": [value * (1 - half_width), value * (1 + half_width)]}
        return optuna.trial.create_trial(values=[value], user_attrs={**attrs, **({START: True} if start else {})})

    study = optuna.create_study(direction="maximize")
    for item in (trial(150.0, start=True), trial(100.0), trial(200.0)):
        study.add_trial(item)
    complete, objective = study.trials, ["throughput_examples_per_s"]
    faster = against_start(complete, [complete[2]], objective)
    assert faster["word"] == "faster" and faster["against_trial"] == 0
    assert faster["ratio"] == pytest.approx(200 / 150) and faster["ci95"][0] > 1
    assert faster["sentence"].startswith("Best trial 2 vs the start (the configured settings), trial 0: ×1.33 (95 % CI")
    # the start is the best: against the runner-up; inside the noise: said so
    close = optuna.create_study(direction="maximize")
    for item in (trial(150.0, start=True, half_width=0.2), trial(145.0, half_width=0.2)):
        close.add_trial(item)
    tie = against_start(close.trials, [close.trials[0]], objective)
    assert tie["word"] == "no difference detected" and tie["against_trial"] == 1
    assert "the runner-up, trial 1" in tie["sentence"] and "found nothing faster beyond the noise" in tie["sentence"]
    # no start enqueued: against the first trial; several objectives: no comparison
    plain = optuna.create_study(direction="maximize")
    for item in (trial(100.0), trial(200.0)):
        plain.add_trial(item)
    assert "vs the first trial, trial 0" in against_start(plain.trials, [plain.trials[1]], objective)["sentence"]
    assert against_start(plain.trials, [plain.trials[1]], ["throughput_examples_per_s", "val_accuracy"]) is None


def test_the_best_trials_comparison_takes_every_repeat_and_their_spread():
    """With repeats, the comparison uses each trial's finished repeats, their spread pooled, not
    the median with the first repeat's interval: repeats that scatter widen it, repeats that agree
    narrow it (as a sweep's sets are compared)."""
    from pathlib import Path

    from bwopt.sweep.search_start import REPEATS, START, against_start, repeat_folders

    def trial(values, start=False):
        repeats = [[value, [value * 0.99, value * 1.01]] for value in values]
        attrs = {REPEATS: repeats, "throughput_examples_per_s_ci95": repeats[0][1], **({START: True} if start else {})}
        return optuna.trial.create_trial(values=[sorted(values)[len(values) // 2]], user_attrs=attrs)

    def compared(start, best):
        study = optuna.create_study(direction="maximize")
        for item in (trial(start, start=True), trial(best)):
            study.add_trial(item)
        return against_start(study.trials, [study.trials[1]], ["throughput_examples_per_s"])

    scattered = compared([100.0, 140.0, 120.0], [130.0, 95.0, 150.0])
    agreeing = compared([120.0, 121.0, 119.0], [130.0, 131.0, 129.0])
    assert scattered["word"] == "no difference detected"  # the medians with one interval: x1.08 (x1.07-x1.10), "faster"
    assert agreeing["word"] == "faster" and agreeing["ratio"] == pytest.approx(130 / 120, rel=1e-3)
    # bwopt's launcher: folders first * repeats + repeat * sets + index
    assert repeat_folders(Path("s"), 4, 1, 3, 2) == [Path("s/9"), Path("s/12")]
    assert repeat_folders(Path("s"), 4, 1, 3, 1) == [Path("s/5")]


@SLOW
def test_a_search_starts_from_the_configured_settings_and_compares_its_best_with_them(tmp_path, mlflow_uri):
    tracking = [f"tracking.uri={mlflow_uri}", "tracking.experiment=search_start"]
    settings = ["hydra.sweeper.n_trials=3", "hydra.sweeper.sampler=random", "hydra.sweeper.seed=1", *tracking]
    task = sweep_tasks.scored_by_prefetch
    results = search(tmp_path / "sweep", ["pipeline.prefetch=choice(0,2,autotune)"], *settings, task=task)
    first = yaml.safe_load((tmp_path / "sweep" / "0" / ".hydra" / "overrides.yaml").read_text())
    assert first == ["pipeline.prefetch=autotune"]  # conf/pipeline/default.yaml's value: the start
    ran = [yaml.safe_load((tmp_path / "sweep" / str(n) / ".hydra" / "overrides.yaml").read_text()) for n in range(3)]
    measured = [sweep_tasks.PREFETCH_THROUGHPUT[yaml.safe_load(item[0].partition("=")[2])] for item in ran]
    best = max(range(3), key=lambda n: (measured[n], -n))
    comparison = results["against_start"]
    assert results["best"][0]["trial"] == comparison["trial"] == best
    if best == 0:  # the start was best: compared with the runner-up
        runner_up = max(range(1, 3), key=lambda n: (measured[n], -n))
        assert comparison["against_trial"] == runner_up
        expected = "faster" if measured[runner_up] < measured[0] else "no difference detected"
    else:
        assert comparison["against_trial"] == 0
        expected = "faster"
    assert comparison["word"] == expected and comparison["ratio"] == pytest.approx(
        measured[best] / measured[comparison["against_trial"]]
    )
    client = MlflowClient(tracking_uri=mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("search_start").experiment_id])
    assert parent.data.tags["mlflow.note.content"].startswith(f"**{comparison['sentence']}**")


@SLOW
def test_each_trial_keeps_every_repeat_it_ran_for_the_comparison(tmp_path):
    from bwopt.sweep.search_start import REPEATS

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    settings = ["hydra.sweeper.n_trials=3", "hydra.sweeper.sampler=random", "hydra.sweeper.seed=1"]
    study = ["hydra.sweeper.study_name=repeats", f"hydra.sweeper.storage={storage}", "hydra.launcher.repeats=2"]
    task = sweep_tasks.scored_by_prefetch_each_repeat_its_own
    search(
        tmp_path / "sweep", ["pipeline.prefetch=choice(0,2,autotune)"], *settings, *study, "tracking=none", task=task
    )
    for trial in optuna.load_study(study_name="repeats", storage=storage).trials:
        folders = [folder for folder in (tmp_path / "sweep").iterdir() if (folder / "job.json").is_file()]
        mine = [
            json.loads((folder / "summary.json").read_text())["figures"]["throughput_examples_per_s"]
            for folder in folders
            if yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) == trial.user_attrs["overrides"]
        ]
        assert len(mine) == 2 and sorted(value for value, _ in trial.user_attrs[REPEATS]) == sorted(mine), trial.number
        assert trial.values == [pytest.approx(sum(mine) / 2)]  # the launcher's median of two


@SLOW  # a hundred configurations composed and refused: about 20 s
def test_a_space_the_schema_refuses_everywhere_ends_in_one_line_and_exit_2_with_nothing_run(tmp_path, capsys):
    from bwopt.app import run_job

    space = ["pipeline.cache=choice(file)", "pipeline.prefetch=choice(0,1)"]  # file needs a cache_path
    with pytest.raises(SystemExit) as ended:
        search(tmp_path / "sweep", space, "hydra.sweeper.n_trials=1", "tracking=none", task=run_job)
    assert ended.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("bwopt: invalid config: 100 sampled configurations in a row were refused")
    assert "pipeline.cache='file' needs pipeline.cache_path" in error
    assert not [path for path in tmp_path.rglob("*") if path.is_dir() and path.name.isdigit()]  # no job ran


@SLOW
def test_a_trial_the_schema_refuses_is_pruned_with_its_reason_and_another_runs_in_its_place(tmp_path):
    from bwopt.app import run_job

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    # cache=file without a cache_path is refused; the default (off) is not in the space: no start trial
    settings = ["hydra.sweeper.n_trials=1", "hydra.sweeper.sampler=random", "hydra.sweeper.seed=2"]
    tiny = ["train.epochs=1", "train.warmup_steps=2", "train.steps_per_epoch=6", "measure.memcpy_bandwidth=false"]
    study = [f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=refused", "tracking=none"]
    results = search(tmp_path / "sweep", ["pipeline.cache=choice(file,memory)"], *settings, *study, *tiny, task=run_job)

    *refused, ran = optuna.load_study(study_name="refused", storage=storage).trials
    assert refused, "seed 2 draws cache=file first"
    for trial in refused:
        assert trial.state is TrialState.PRUNED and trial.params == {"pipeline.cache": "file"}
        assert "pipeline.cache='file' needs pipeline.cache_path" in trial.user_attrs["refused"]
    assert ran.state is TrialState.COMPLETE and ran.params == {"pipeline.cache": "memory"}
    assert results["num_refused"] == len(refused) and results["best"][0]["trial"] == ran.number
    folders = [path.name for path in (tmp_path / "sweep").iterdir() if path.is_dir() and path.name.isdigit()]
    assert folders == [str(ran.number)]  # folder n is trial n; a refused trial has none
    assert (tmp_path / "sweep" / str(ran.number) / "summary.json").is_file()
