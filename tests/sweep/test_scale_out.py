"""Scale-out presets: SLURM and Ray launchers compose without their plugins; a sweep against a real MLflow server."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import REPO, compose_config, mlflow_server, run_bwopt
from hydra.core.plugins import Plugins

from bwopt.app import config_dir

TINY = ["train.epochs=1", "train.warmup_steps=2", "train.steps_per_epoch=6", "measure.memcpy_bandwidth=false"]
PLUGINS = {"slurm": "hydra_plugins.hydra_submitit_launcher", "ray": "hydra_plugins.hydra_ray_launcher"}
SERVER_START_TIMEOUT_S = 90


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher,target",
    [
        ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
        ("ray", "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"),
    ],
)
def test_scale_out_launcher_presets_are_self_contained_and_compose(tmp_path, launcher, target):
    """No defaults entry on the plugin's own config, so composing needs nothing the plugin brings
    (the plugins are test dependencies: this is how a machine without them composes the preset)."""
    preset = yaml.safe_load((Path(config_dir()) / "hydra" / "launcher" / f"{launcher}.yaml").read_text())
    assert "defaults" not in preset and preset["_target_"] == target
    arguments = [f"hydra/launcher={launcher}", "--cfg", "hydra", "--resolve"]
    result = run_bwopt(*arguments, cwd=tmp_path, timeout=60, env={"RAY_ADDRESS": "10.0.0.5:6379"})
    assert result.returncode == 0, result.stderr[-3000:]
    composed = yaml.safe_load(result.stdout)["hydra"]
    config = composed["launcher"]
    assert config["_target_"] == target and composed["runtime"]["choices"]["hydra/launcher"] == launcher
    if launcher == "slurm":
        assert config["submitit_folder"] == f"{composed['sweep']['dir']}/.submitit/%j"
        assert config["array_parallelism"] >= 1 and config["tasks_per_node"] == 1
    else:
        assert config["ray"]["init"]["address"] == "10.0.0.5:6379"  # from RAY_ADDRESS
        assert config["ray"]["remote"]["max_calls"] == 1  # a fresh worker process per job
        assert config["ray"]["remote"]["max_retries"] == 0  # a failed job runs once, not four times


@pytest.mark.parametrize("launcher", sorted(PLUGINS))
def test_scale_out_launchers_instantiate_where_their_plugin_is_installed(launcher):
    if importlib.util.find_spec(PLUGINS[launcher]) is None:
        pytest.skip(f"{PLUGINS[launcher]} is not installed (pip install -e '.[{launcher}]')")
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        config = hydra.compose_config("config", [f"hydra/launcher={launcher}"], run_mode=RunMode.MULTIRUN)
        instance = Plugins.instance()._instantiate(config.hydra.launcher)
    assert type(instance).__module__.startswith(PLUGINS[launcher])


def test_the_server_tracking_preset_is_the_mlflow_tracker_on_a_server():
    tracking = compose_config(["tracking=server/mlflow"]).tracking
    assert tracking.name == "mlflow" and tracking.uri == "http://127.0.0.1:5000"
    assert compose_config(["tracking=server/mlflow", "tracking.uri=http://mlflow:8080"]).tracking.uri == (
        "http://mlflow:8080"
    )


@pytest.mark.slow
def test_a_sweep_against_a_real_mlflow_server_has_its_parent_and_children_there(tmp_path):
    from mlflow import MlflowClient

    with mlflow_server(tmp_path) as uri:
        work = tmp_path / "work"
        work.mkdir()
        server_tracking = ["tracking=server/mlflow", f"tracking.uri={uri}"]
        result = run_bwopt("-m", "pipeline.prefetch=0,2", *server_tracking, *TINY, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
        assert not (work / "outputs" / "mlflow.db").exists()  # nothing went to the default sqlite store

        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("bwopt")
        name = "attributes.run_name LIKE 'sweep pipeline.prefetch=0,2 · %'"
        (parent,) = client.search_runs([experiment.experiment_id], name)
        assert parent.info.status == "FINISHED"
        children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
        assert sorted(child.info.run_name.split(",")[0] for child in children) == [
            "pipeline.prefetch=0",
            "pipeline.prefetch=2",
        ]
        assert all(child.info.status == "FINISHED" for child in children)
        assert all(child.data.metrics["throughput_examples_per_s"] > 0 for child in children)
        assert "report.md" in {item.path for item in client.list_artifacts(parent.info.run_id)}


# A small pipelines workload, its naive start run twice by the tuner: two jobs whatever the tuner
# would propose next (on a busy machine it may propose nothing the cores could run faster).
TUNE_WORKLOAD = [
    *["experiment=pipelines", "pipeline=naive", "train.epochs=1", "train.steps_per_epoch=8"],
    *["measure.min_timed_s=0.5", "measure.ceiling_steps=20", "measure.memcpy_bandwidth=false"],
]
THE_START_TWICE = ["hydra.sweeper.max_trials=1", "hydra.sweeper.repeats=2", "hydra.sweeper.extra_rounds=0"]


def the_start_twice(launcher, work, env=None):
    """`tune=pipeline` through `launcher` (its overrides) in `work`: the start, run twice, in job
    folders 0 and 1 of `work`/tuning; (the sweep folder, the closing line)."""
    tuning = run_bwopt(
        "-m", "tune=pipeline", *launcher, *TUNE_WORKLOAD, *THE_START_TWICE, "hydra.sweep.dir=tuning",
        cwd=work, timeout=400, env=env,
    )  # fmt: skip
    assert tuning.returncode == 0, tuning.stderr[-3000:]
    sweep = work / "tuning"
    assert sorted(path.name for path in sweep.iterdir() if path.name.isdigit()) == ["0", "1"], tuning.stdout[-3000:]
    closing = next(line for line in tuning.stdout.splitlines() if line.startswith("tuned: "))
    assert ", 2 runs, " in closing and f"**{closing}**" in (sweep / "tune.md").read_text()
    return sweep, closing


@pytest.mark.slow
def test_tune_and_the_search_run_their_trials_through_the_submitit_plugin(tmp_path):
    """The SLURM launcher's plugin with its local executor (`hydra/launcher=submitit_local`): the
    same job pickling, submission and result collection as on a cluster, each job a process that
    submitit starts. The tuner and the search read their trials back from the job folders alike."""
    if importlib.util.find_spec(PLUGINS["slurm"]) is None:
        pytest.skip(f"{PLUGINS['slurm']} is not installed (pip install -e '.[slurm]')")
    local = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]
    sweep, closing = the_start_twice(local, tmp_path)
    # submitit ran them: its own folder holds each job's pickled call and its log
    submitted = [path for path in (sweep / ".submitit").iterdir() if path.name.isdigit()]
    assert len(submitted) == 2 and all(list(folder.glob("*_submitted.pkl")) for folder in submitted)
    ran = [yaml.safe_load((sweep / name / ".hydra" / "overrides.yaml").read_text()) for name in ("0", "1")]
    assert ran[0] == ran[1] and set(TUNE_WORKLOAD) <= set(ran[0])  # the tuner's measuring overrides besides
    assert (sweep / "tuned.yaml").read_text().split() == TUNE_WORKLOAD  # the start, as given

    search = run_bwopt(
        "-m", "hparams_search=pipeline", *local, *TUNE_WORKLOAD, "hydra.sweeper.n_trials=2",
        "hydra.sweep.dir=search", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert search.returncode == 0, search.stderr[-3000:]
    summary = yaml.safe_load((tmp_path / "search" / "search.yaml").read_text())
    assert summary["num_complete"] == 2 and summary["best"][0]["values"]["throughput_examples_per_s"] > 0

    # each sweep's jobs are the children of one parent run, which holds the sweep's own files, as
    # under bwopt's launcher: their id reached the jobs in the environment submitit's processes inherit
    tune = parent_with_its_jobs(tmp_path, "tune", sweep, "tune.md")
    assert f"**{closing}**" in tune.data.tags["mlflow.note.content"]  # tune's table, its description
    search = parent_with_its_jobs(tmp_path, "search", tmp_path / "search", "search.yaml")
    assert search.data.tags["bwopt.study_name"] == "pipeline"


def parent_with_its_jobs(work, name: str, folder, sweep_file: str):
    """The one parent run of sweep `name` (`tune` or `search`) in `work`'s MLflow store, finished,
    holding `sweep_file` and the report, with every job folder's run as a finished child."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("bwopt").experiment_id
    (parent,) = client.search_runs([experiment_id], f"attributes.run_name LIKE '{name} pipeline · %'")
    assert parent.info.status == "FINISHED", parent.data.tags.get("bwopt.end_reason")
    assert {sweep_file, "report.md"} <= {item.path for item in client.list_artifacts(parent.info.run_id)}
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    jobs = [path for path in folder.iterdir() if path.name.isdigit()]
    summaries = [json.loads((path / "summary.json").read_text()) for path in jobs]
    assert jobs and sorted(child.info.run_id for child in children) == sorted(item["run_id"] for item in summaries)
    assert all(child.info.status == "FINISHED" for child in children)
    assert all(child.data.metrics["throughput_examples_per_s"] > 0 for child in children)
    return parent


# A local Ray cluster started by the launcher, without its dashboard. Ray 2.60 takes a node address of
# 127.0.0.1 for the machine's outward one and listens on every interface; its single-machine switch
# makes the node's address loopback, so every server it starts listens on 127.0.0.1 only.
RAY_LOCAL = ["hydra/launcher=ray", "+hydra.launcher.ray.init.include_dashboard=false"]
RAY_ON_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.mark.slow
def test_tune_runs_its_trials_as_ray_tasks_on_a_local_cluster(tmp_path):
    """The Ray launcher's plugin (among the test dependencies, as in `.[ray]`): a local cluster it
    starts on loopback without its dashboard, each trial a Ray task in a worker process that
    inherits the launching process's environment, so the parent run's id reaches every job."""
    if importlib.util.find_spec(PLUGINS["ray"]) is None:
        pytest.skip(f"{PLUGINS['ray']} is not installed (pip install -e '.[ray]')")
    sweep, closing = the_start_twice(RAY_LOCAL, tmp_path, env=RAY_ON_LOOPBACK)
    tune = parent_with_its_jobs(tmp_path, "tune", sweep, "tune.md")
    assert f"**{closing}**" in tune.data.tags["mlflow.note.content"]


# The user's own data function: numbers, or strings that bwopt refuses once it reads the data (exit 2).
USER_SOURCE = """
import numpy as np

def examples(kind):
    import tensorflow as tf

    values = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    features = values if kind == "numbers" else np.array([str(value) for value in values[:, 0]])
    return tf.data.Dataset.from_tensor_slices((features, (values[:, 0] > 0).astype("int64")))
"""


def plain_sweep_with_a_bad_job(launcher, work, env=None) -> str:
    """`python -m bwopt -m` through `launcher` (its overrides) in `work`, over the user's data function:
    job 0 numbers, job 1 strings (bwopt exits 2 on them); checks it ends in one line, exit code 1, no
    traceback, and returns that line."""
    (work / "user_source.py").write_text(USER_SOURCE)
    result = run_bwopt(
        "-m", *launcher, "hydra.sweep.dir=sweep",
        *["data=custom", "data._target_=user_source.examples", "data.num_classes=2", "split=uniform"],
        "+data.kwargs.kind=numbers,strings", "train.epochs=3", "train.warmup_steps=1", "measure.memcpy_bandwidth=false",
        cwd=work, timeout=300, env={"PYTHONPATH": os.pathsep.join([str(REPO), str(work)]), **(env or {})},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("bwopt: sweep failed:")]
    assert line.startswith("bwopt: sweep failed: job #1 (data=custom ") and "kind=strings" in line.split(")")[0]
    assert (work / "sweep" / "0" / "summary.json").is_file() and (work / "sweep" / "report.md").is_file()
    return line


@pytest.mark.slow
def test_a_plain_sweep_under_submitit_keeps_its_parent_run_and_report_and_ends_in_one_line(tmp_path):
    """A plain sweep (bwopt's basic sweeper) through submitit's local executor, one job of which
    exits 2 on bad data: submitit raises for it and hands back no job of the batch; the sweep reads
    the finished job back from its folder, names the failed one in one line, exits 1, and keeps
    its report and its parent run with the finished job as its child."""
    if importlib.util.find_spec(PLUGINS["slurm"]) is None:
        pytest.skip(f"{PLUGINS['slurm']} is not installed (pip install -e '.[slurm]')")
    line = plain_sweep_with_a_bad_job(["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"], tmp_path)
    assert "left no result; LocalLauncher raised UncompletedJobError: bwopt: bad data: " in line
    assert "yields features of type string" in line and "1 of 2 job(s) failed" in line

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("bwopt").experiment_id
    (parent,) = client.search_runs([experiment_id], "attributes.run_name LIKE 'sweep +data.kwargs.kind=%'")
    assert parent.info.run_name.startswith("sweep +data.kwargs.kind=numbers,strings · ")
    assert parent.info.status == "FINISHED"  # one job finished: the sweep measured something
    assert "report.md" in {item.path for item in client.list_artifacts(parent.info.run_id)}
    (child,) = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert child.info.run_name == "+data.kwargs.kind=numbers" and child.info.status == "FINISHED"
    summary = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
    assert summary["run_id"] == child.info.run_id
    assert "+data.kwargs.kind=strings" in (tmp_path / "sweep" / "report.md").read_text()


@pytest.mark.slow
def test_a_plain_sweep_of_ray_tasks_ends_in_one_line_when_a_job_exits(tmp_path):
    """A plain sweep as Ray tasks, a job of which exits 2 on bad data: Ray raises WorkerCrashedError
    for it, and the sweep ends in one line and its report, not in Ray's traceback."""
    if importlib.util.find_spec(PLUGINS["ray"]) is None:
        pytest.skip(f"{PLUGINS['ray']} is not installed (pip install -e '.[ray]')")
    line = plain_sweep_with_a_bad_job(RAY_LOCAL, tmp_path, env=RAY_ON_LOOPBACK)
    assert "left no result; RayLauncher raised WorkerCrashedError: " in line
