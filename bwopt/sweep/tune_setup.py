"""What the tuner settles before its first trial: its settings, the workload it starts from, the
start's knobs as the cost model reads them, and the probe of the start's pipeline.

`BwoptTunerConf` is checked when Hydra instantiates the sweeper, before any trial and before
TensorFlow loads (the probe, `run_probe`, runs in a process of its own).
"""

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from bwopt.measure.uncertainty import POCOCK_Z
from bwopt.pipeline import caches
from bwopt.sweep.tune_decide import ALLOWED_CHANGES, Profile, Stage
from bwopt.sweep.tune_record import Trial

MAX_EXTRA_ROUNDS = max(POCOCK_Z) - 1  # looks with a known Pocock level
NOT_PASSED_ON = ("tune", "hparams_search", "measure.ceilings")  # the sweep's own choices


class TuneConfigError(ValueError):
    """A tuner setting or a workload override the tuner cannot run with."""


@dataclass
class BwoptTunerConf:
    """`hydra.sweeper.*` when `hydra/sweeper=bwopt_tuner`.

    Attributes:
        max_trials: trials in all, the start included.
        repeats: runs of each trial, one after the other (2: their spread, pooled over the trials,
            enters every comparison; 1: each interval holds only its own run's noise).
        rerun_incumbent: run the incumbent as many times again between a candidate's repeats
            (c, i, i, c; before its one run with repeats=1): its runs then span the tuning, and how
            their round-to-round means scatter beyond its own spread within a round measures the
            machine's drift, which enters every comparison.
        extra_rounds: rounds more a candidate may run (its repeats again, with `rerun_incumbent`
            around as many runs of the incumbent) while its comparison is undecided but leans its
            way; every comparison then takes Pocock's per-look level for 1 + extra_rounds looks,
            so each candidate's looks together err no more often than one 95 % comparison (0 to 4).
        target_fraction: stop once the incumbent reaches this fraction of its compute ceiling.
        allow: opt-in changes that alter the math or the pixels (bwopt.sweep.tune_opt_in.OPT_IN):
            precision (a 16-bit policy where the device has units for it), batch_size (a larger
            batch, its learning rate scaled, where the host's cost per step is a large share of the
            step), decode (JPEGs decoded whole into a cache instead of only their crop windows).
        memory_share: of the memory available at the start, what caches and prefetch may hold.
        probe: probe the pipeline's stages (tf.data's model) before planning; false runs the
            start alone.
        params: a sweep's values that an `experiment` preset may carry (`pipeline: naive,tuned`):
            tune starts from one workload, so they are not run (the command line chooses).
    """

    _target_: str = "hydra_plugins.bwopt_tuner.bwopt_tuner.BwoptTuner"
    max_trials: int = 5
    repeats: int = 2
    rerun_incumbent: bool = True
    extra_rounds: int = 2
    target_fraction: float = 0.9
    allow: List[str] = field(default_factory=list)
    memory_share: float = 0.5
    probe: bool = True
    params: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.allow = list(self.allow)
        if self.max_trials < 1:
            raise TuneConfigError(f"hydra.sweeper.max_trials={self.max_trials}; expected an integer >= 1")
        if self.repeats < 1:
            raise TuneConfigError(f"hydra.sweeper.repeats={self.repeats}; expected an integer >= 1")
        if not 0 <= self.extra_rounds <= MAX_EXTRA_ROUNDS:
            raise TuneConfigError(
                f"hydra.sweeper.extra_rounds={self.extra_rounds}; expected an integer in 0..{MAX_EXTRA_ROUNDS}"
            )
        if not 0 < self.target_fraction <= 1:
            raise TuneConfigError(f"hydra.sweeper.target_fraction={self.target_fraction}; expected a value in (0, 1]")
        if not 0 < self.memory_share <= 1:
            raise TuneConfigError(f"hydra.sweeper.memory_share={self.memory_share}; expected a value in (0, 1]")
        unknown = [item for item in self.allow if item not in ALLOWED_CHANGES]
        if unknown:
            raise TuneConfigError(f"hydra.sweeper.allow={self.allow}: expected some of {', '.join(ALLOWED_CHANGES)}")


def workload_overrides(arguments: List[str]) -> List[str]:
    """The command line's overrides minus the sweep's own; a sweep (a,b) cannot be tuned from."""
    parsed = OverridesParser.create().parse_overrides(list(arguments))
    swept = [override.input_line for override in parsed if override.is_sweep_override()]
    if swept:
        raise TuneConfigError(f"{' '.join(swept)}: tune starts from one workload; give one value per key")
    return [override.input_line for override in parsed if override.get_key_element() not in NOT_PASSED_ON]


def start_knobs(config: DictConfig, cores: int) -> Dict[str, Any]:
    """The start's pipeline knobs as the cost model reads them; autotune counts as the cores (parallelism)."""
    pipeline = config.pipeline

    def count(value, autotuned: int) -> int:
        return autotuned if value == "autotune" else int(value)

    return {
        "map_parallelism": count(pipeline.map_parallelism, cores),
        "interleave_width": count(pipeline.interleave.num_parallel_calls, cores),
        "prefetch": count(pipeline.prefetch, 2),
        "cached": caches(pipeline),
        "vectorized": bool(pipeline.vectorized_map),
        "uint8": pipeline.transfer_dtype == "uint8",
        "steps_per_execution": int(config.train.steps_per_execution),
        "precision": config.device.precision,
        "fetch_to_device": bool(pipeline.distribute.fetch_to_device),
        "fused": bool(pipeline.options.map_and_batch_fusion),
    }


def profile_of(picture: Dict[str, Any], start: Trial) -> Profile:
    """The cost model's view: the probe's stages and the start's step time, the cores its step
    holds and its host overhead."""
    fields = set(Stage.__dataclass_fields__)

    def stages_of(listed) -> tuple:
        return tuple(Stage(**{key: value for key, value in stage.items() if key in fields}) for stage in listed)

    stages = stages_of(picture["stages"])
    whole = picture.get("whole_decode_stages")
    batch = picture["batch_size"]
    return Profile(
        stages=stages,
        batch_size=batch,
        examples_per_epoch=picture["examples_per_epoch"],
        step_time_s=batch / start.compute_ceiling if start.compute_ceiling else 0.0,
        vectorized_map_cost_s=picture["vectorized_map_cost_s"],
        integer_features=picture["integer_features"],
        feature_bytes_per_example=picture["feature_bytes_per_example"],
        num_files=picture["num_files"],
        host_overhead_share=start.step_partition.get("host_overhead", 0.0),
        steps_per_epoch=picture["steps_per_epoch"],
        epochs=picture["epochs"],
        sixteen_bit=picture["sixteen_bit"],
        sixteen_bit_reason=picture["sixteen_bit_reason"],
        optimizer=picture["optimizer"],
        learning_rate=picture["learning_rate"],
        steps_per_epoch_set=picture["steps_per_epoch_set"],
        warmup_steps=picture["warmup_steps"],
        device=picture["device"],
        device_copy_s=picture["device_copy_s"],
        strategy=picture["strategy"],
        step_cores=int(start.step_cores or 1),
        whole_decode_stages=stages_of(whole) if whole else None,
        fused_map_batch_cost_s=picture.get("fused_map_batch_cost_s"),
    )


def run_probe(overrides: List[str], output: Path, whole_decode: bool = False) -> Dict[str, Any]:
    """The per-stage picture of the pipeline `overrides` configure (bwopt.sweep.tune_probe, a fresh
    process); `whole_decode`: with the stages of decoding whole images, where it decodes crop windows."""
    with tempfile.TemporaryDirectory(prefix="bwopt-tune-") as scratch:
        arguments = Path(scratch) / "overrides.json"
        arguments.write_text(json.dumps(overrides))
        command = [sys.executable, "-m", "bwopt.sweep.tune_probe", str(arguments), str(output)]
        command += ["--whole-decode"] if whole_decode else []
        subprocess.run(command, check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    return json.loads(output.read_text())
