"""`python -m bwopt -m tune=pipeline ...` as users run it: real trials, each a fresh process, one parent run."""

import json
import statistics

import pytest
import yaml
from conftest import run_bwopt, small_sample_images
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow import MlflowClient

pytestmark = pytest.mark.slow
WORKLOAD = ["experiment=pipelines", "pipeline=naive", "train.epochs=1", "train.steps_per_epoch=8"]
SMALL = ["measure.min_timed_s=0.5", "measure.ceiling_steps=20", "measure.memcpy_bandwidth=false"]


def test_tune_runs_its_trials_and_repeats_writes_tuned_yaml_and_annotates_one_parent_run(tmp_path):
    result = run_bwopt(
        "-m",
        "tune=pipeline",
        *WORKLOAD,
        *SMALL,
        "hydra.sweeper.max_trials=2",  # and hydra.sweeper.repeats=2, rerun_incumbent=true, the defaults
        # one round per candidate, whatever its first look says (extra rounds: test_tune_rounds.py)
        "hydra.sweeper.extra_rounds=0",
        "hydra.sweep.dir=tuning",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "tuning"
    folders = sorted(int(path.name) for path in sweep.iterdir() if path.is_dir() and path.name.isdigit())
    # max_trials bounds the trials, the start included; each ran twice, the start twice more between
    # the proposal's two runs
    assert folders == [0, 1, 2, 3, 4, 5]

    # every run had the sweep's own choice; the start's four (folders 0, 1, 3 and 4) ran the workload
    # as given, the proposal's two (2, 5) the same change
    ran = [yaml.safe_load((sweep / str(n) / ".hydra" / "overrides.yaml").read_text()) for n in folders]
    assert all("tune=pipeline" in overrides and "measure.ceilings=true" in overrides for overrides in ran)
    assert ran[0] == ran[1] == ran[3] == ran[4] and ran[2] == ran[5]
    assert not [item for item in ran[0] if item.startswith("pipeline.")]
    changed = [item for item in ran[2] if item not in ran[0]]
    assert changed and all(item.startswith(("pipeline.", "train.steps_per_execution")) for item in changed)

    # tuned.yaml: the workload and the kept changes, runnable as overrides; none of the sweep's own keys
    tuned = (sweep / "tuned.yaml").read_text().split()
    OverridesParser.create().parse_overrides(tuned)
    kept = [item for item in changed if item in tuned]
    assert kept in ([], changed)  # the one change is kept whole or reverted whole
    assert tuned == [*WORKLOAD, *SMALL, *kept]
    # the same as an experiment config, run from the sweep folder as users would: the same config
    # (the key run_bwopt would otherwise set for a run, as tuned.yaml sets it)
    arguments = ["-cd", str(sweep), "--cfg", "job", "experiment=tuned", "measure.min_timed_s=0.5"]
    as_experiment = run_bwopt(*arguments, cwd=tmp_path, timeout=60)
    as_overrides = run_bwopt(*tuned, "--cfg", "job", cwd=tmp_path, timeout=60)
    assert as_experiment.returncode == as_overrides.returncode == 0, as_experiment.stderr[-3000:]
    assert yaml.safe_load(as_experiment.stdout) == yaml.safe_load(as_overrides.stdout)

    report = (sweep / "tune.md").read_text()
    closing = next(line for line in result.stdout.splitlines() if line.startswith("tuned: "))
    assert f"**{closing}**" in report and "6 runs" in closing
    # each trial's word is tune's own comparison; the folder's sweep ranking stays in report.md
    log = result.stdout + result.stderr
    assert "Sweep report:" in log and "Best: " not in log and "No best: " not in log
    # a kept change states its gain with its interval; a reverted one claims none
    assert ("95 % CI" in closing) == bool(kept) != ("no change beat the start beyond the noise" in closing)
    assert report.count("\n| ") >= 3  # header, start, the one proposal
    assert "The start's stages" in report and "| map (augment) | map |" in report  # what the plan came from
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert ("| yes |" in rows["| 1"]) == bool(kept)
    assert rows["| 0"].endswith("| 4 (0, 1, 3, 4) |") and rows["| 1"].endswith("| 2 (2, 5) |")
    # the proposal was compared with the start's runs beside it, with the spread between runs of one
    # setting in one round (the start's two in each of its rounds, the proposal's two), and the report says so
    assert "each trial ran 2 times, and the incumbent as often beside each candidate" in report
    assert "3 degrees of freedom" in report

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bwopt")
    (parent,) = client.search_runs([experiment.experiment_id], "attributes.run_name LIKE 'tune pipeline %'")
    assert parent.info.status == "FINISHED" and parent.data.metrics["tune_num_trials"] == 2
    # its description in the UI: tune.md, the closing line first, then the table of the path
    description = parent.data.tags["mlflow.note.content"]
    assert description.startswith(f"**{closing}**") and "\n| trial | change | reason |" in description
    assert rows["| 1"] in description
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    summaries = [json.loads((sweep / str(n) / "summary.json").read_text()) for n in folders]
    assert sorted(child.info.run_id for child in children) == sorted(summary["run_id"] for summary in summaries)
    # the tuned trial's figure: the median of its runs
    final = [summaries[2], summaries[5]] if kept else [summaries[0], summaries[1], summaries[3], summaries[4]]
    assert parent.data.metrics["tune_throughput_examples_per_s"] == pytest.approx(
        statistics.median(summary["figures"]["throughput_examples_per_s"] for summary in final)
    )
    artifacts = {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert {"tuned.yaml", "experiment", "tune.md", "tune_path.png", "tune_probe_start.json"} <= artifacts
    assert [item.path for item in client.list_artifacts(parent.info.run_id, "experiment")] == ["experiment/tuned.yaml"]


@pytest.mark.parametrize(
    "setting, named",
    [
        ("hydra.sweeper.max_trials=0", "hydra.sweeper.max_trials=0"),
        ("hydra.sweeper.allow=[layers]", "hydra.sweeper.allow=['layers']"),
        ("hydra.sweeper.repeats=0", "hydra.sweeper.repeats=0"),
        ("hydra.sweeper.extra_rounds=9", "hydra.sweeper.extra_rounds=9"),
        ("hydra.launcher.repeats=2", "hydra.launcher.repeats=2"),
        ("pipeline.prefetch=0,2", "pipeline.prefetch=0,2"),
    ],
)
def test_a_tuning_that_cannot_run_is_one_line_with_code_2_and_starts_no_trial(tmp_path, setting, named):
    result = run_bwopt("-m", "tune=pipeline", setting, "hydra.sweep.dir=tuning", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("bwopt: ")]
    assert named in line and "Traceback" not in result.stderr
    assert not (tmp_path / "tuning" / "0").exists()


def test_allowed_whole_image_decoding_is_probed_then_run_with_its_cache(tmp_path):
    """`allow=[decode]` from a fused decode of random crop windows: the probe reads the pipeline
    decoding whole images too, and with nothing lossless left to try (`pipeline=tuned` overlaps,
    parallelises and caches the files' bytes already; four steps per call leave the host's share
    under the threshold) tune runs that proposal, with its cache. JPEGs of 160-256 px: decoding
    them whole outweighs the small step even where other work on the cores stretches the step's
    wall time (the model weighs the step by its wall time, the stages by their CPU time)."""
    small = small_sample_images(tmp_path / "images", 150)
    images = [*(item for item in small if not item.startswith("data.saved_side_px=")), "data.saved_side_px=[160,256]"]
    settings = ["hydra.sweeper.max_trials=2", "hydra.sweeper.repeats=1", "hydra.sweeper.extra_rounds=0"]
    result = run_bwopt(
        "-m",
        "tune=pipeline",
        *images,
        "pipeline=tuned",
        "train.global_batch_size=10",
        "train.epochs=3",
        "train.steps_per_execution=4",
        *SMALL,
        *settings,
        "hydra.sweeper.allow=[decode]",
        "tracking=none",
        "hydra.sweep.dir=tuning",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "tuning"
    picture = json.loads((sweep / "tune_probe_start.json").read_text())
    names = [stage["name"] for stage in picture["stages"]]
    assert "map (decode)" not in names  # the start decodes each crop window in its random map
    whole = [stage["name"] for stage in picture["whole_decode_stages"]]
    assert whole.index("map (decode)") < whole.index("shuffle, repeat"), whole
    # the start, the start again beside the candidate, the candidate
    ran = [yaml.safe_load((sweep / str(n) / ".hydra" / "overrides.yaml").read_text()) for n in (0, 1, 2)]
    assert ran[0] == ran[1] and [item for item in ran[2] if item not in ran[0]] == [
        "pipeline.fused_decode_crop=false",
        "pipeline.cache=memory",
    ]
    report = (sweep / "tune.md").read_text()
    assert "| 1 | decode whole: `pipeline.fused_decode_crop=false`, `pipeline.cache=memory` |" in report
    assert "two levels" in report and "The same pipeline decoding whole images" in report
    assert "| map (decode) | map |" in report
