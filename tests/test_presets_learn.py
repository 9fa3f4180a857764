"""Every preset learns reliably, whichever of its swept settings feeds it and whatever the seed.

A preset compares settings that change only speed (tests/test_same_examples.py), so its jobs
may differ in validation accuracy only by the noise of training itself; each preset is chosen so
that this noise is small. Each runs here as it ships (its own workload, epochs and learning
rate), in process: on seeds 0-4 with its first swept setting, and every other swept setting on
the seeds of `SEEDS_ACROSS_SETTINGS` (seed 0 unless named). All of a preset's accuracies lie within
`sweep.accuracy_tolerance` (0.03) of each other and far above chance. Before the presets were
fixed, `experiment=pipelines` spanned 0.10-0.90 and `experiment=scaling` sat at chance.

What a process cannot change once TensorFlow has started (the number of logical devices, GPU
memory growth) is left at this process's set-up: `scaling` sweeps the replica count over
`mirrored`'s workload, which runs here on one replica (`strategy=default`) and two (`mirrored`);
`memory_growth` runs its workload on the CPU. `imagenet_like` (MobileNetV2, about 70 s a run)
runs each job as a test of its own, so that `make test`'s two workers share its seven runs; each
must reach 1 - tolerance, which (accuracy being at most 1) puts them within the tolerance of each
other.
"""

from pathlib import Path

import pytest
from conftest import compose_config, experiment_presets
from omegaconf import OmegaConf

from bwopt.app import config_dir, validate

SEEDS = (0, 1, 2, 3, 4)
QUIET = ["tracking=none", "measure.memcpy_bandwidth=false", "measure.progress=false", "measure.plots=false"]
# preset -> overrides that let it run in this process (see the module docstring)
IN_PROCESS = {"memory_growth": ["device=cpu"]}
# Swept keys a running process cannot change; their preset runs with this process's setting.
PER_PROCESS_KEYS = {"device.num_cpu_devices", "device.memory_growth"}
# The issue's own check: naive and tuned on seeds 0, 1 and 2.
SEEDS_ACROSS_SETTINGS = {"pipelines": (0, 1, 2)}
# preset -> why it is not run here
LEFT_OUT = {"scaling": "mirrored's workload; a replica count needs a process"}
# preset -> run job by job (test_a_long_preset_reaches_...), each job a test of its own
JOB_BY_JOB = {"imagenet_like"}
# Every preset learns to at least this (compression, digits: 0.96-0.98; the others 1.00); chance is
# 0.10 for the ten classes of digits and synthetic, 0.50 for artificial's two.
FLOOR = 0.9


def swept_settings(preset: str):
    """[(key, [values])] of the preset's own sweep (hydra.sweeper.params), per-process keys left out."""
    params = OmegaConf.load(Path(config_dir()) / "experiment" / f"{preset}.yaml").hydra.sweeper.params
    return [(key, str(values).split(",")) for key, values in params.items() if key not in PER_PROCESS_KEYS]


def jobs(preset: str):
    """(seed, overrides) of each run: the first setting on every seed, every other on a few."""
    sweep = swept_settings(preset)
    first = [f"{key}={values[0]}" for key, values in sweep]
    runs = [(seed, first) for seed in SEEDS]
    for index, (key, values) in enumerate(sweep):
        for value in values[1:]:
            overrides = [*first[:index], f"{key}={value}", *first[index + 1 :]]
            runs += [(seed, overrides) for seed in SEEDS_ACROSS_SETTINGS.get(preset, (0,))]
    return runs


def test_every_preset_runs_every_seed_and_every_setting_here_unless_left_out_with_a_reason():
    assert set(LEFT_OUT) <= set(experiment_presets())
    assert jobs("prefetch") == [
        *[(seed, ["pipeline.prefetch=0"]) for seed in SEEDS],
        (0, ["pipeline.prefetch=1"]),
        (0, ["pipeline.prefetch=autotune"]),
    ]
    for preset in set(experiment_presets()) - set(LEFT_OUT):
        runs = jobs(preset)
        assert {seed for seed, _ in runs} == set(SEEDS), preset
        for key, values in swept_settings(preset):
            assert {f"{key}={value}" for value in values} <= {item for _, overrides in runs for item in overrides}


@pytest.mark.slow  # every preset as it ships: 5-8 runs of 3-30 s each
@pytest.mark.parametrize("preset", sorted(set(experiment_presets()) - set(LEFT_OUT) - JOB_BY_JOB))
def test_the_preset_learns_the_same_whatever_the_setting_and_seed(run_experiment, preset):
    tolerance = validate(compose_config()).sweep.accuracy_tolerance
    accuracies = {}
    for seed, overrides in jobs(preset):
        summary = run_experiment(
            f"experiment={preset}", *IN_PROCESS.get(preset, []), *overrides, f"seed={seed}", *QUIET
        )
        assert summary.status == "FINISHED", (preset, seed, overrides)
        accuracies[" ".join(overrides), seed] = summary.final_metrics["val_accuracy"]
    spread = max(accuracies.values()) - min(accuracies.values())
    assert spread <= tolerance, accuracies
    assert min(accuracies.values()) >= FLOOR, accuracies


@pytest.mark.slow  # MobileNetV2 for 12 epochs: about 70 s
@pytest.mark.parametrize(
    "preset,seed,overrides",
    [(preset, seed, overrides) for preset in sorted(JOB_BY_JOB) for seed, overrides in jobs(preset)],
    ids=lambda value: " ".join(value) if isinstance(value, list) else str(value),
)
def test_a_long_preset_reaches_one_minus_the_tolerance_on_each_seed_and_setting(
    run_experiment, preset, seed, overrides
):
    tolerance = validate(compose_config()).sweep.accuracy_tolerance
    summary = run_experiment(f"experiment={preset}", *overrides, f"seed={seed}", *QUIET)
    assert summary.status == "FINISHED"
    assert summary.final_metrics["val_accuracy"] >= 1 - tolerance, summary.final_metrics
