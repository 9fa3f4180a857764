"""Stop and resume: a run stopped by a signal (a scheduler's preemption) keeps its state in its folder,
and the same run resumes from it, continuing the same MLflow run.

What is kept, in `<run folder>/checkpoint/`: the model's and the optimizer's variables at the stop
(`tf.train.Checkpoint`), and `state.json`: the MLflow run id, the epochs finished, the step times of
those epochs, the last finished epoch's metrics, the run's overrides and its whole config (flat,
secrets masked). A resumed run starts at the first unfinished epoch (the steps of the epoch that
was cut short run again, on the weights as they were at the stop), so it ends with the same total
steps and its figures cover every epoch.

A run resumes only with the config it stopped with (`changed_keys`), except for the keys in
`MAY_CHANGE`: how long it trains, what is measured after and how it is shown and named.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

FOLDER = "checkpoint"
STATE = "state.json"


@dataclass
class ResumeState:
    run_id: Optional[str]
    epochs_done: int
    input_wait_s: List[float] = field(default_factory=list)
    compute_s: List[float] = field(default_factory=list)
    cpu_s: List[float] = field(default_factory=list)  # NaN where not read
    epoch_metrics: Dict[str, float] = field(default_factory=dict)
    overrides: List[str] = field(default_factory=list)
    config: Dict[str, str] = field(default_factory=dict)  # bwopt.tracking.flatten of the resolved config


# Keys (and key prefixes, ending in ".") whose value may differ between a stopped run and its
# resumption: the epochs to reach, what is measured after training, what is printed, how the MLflow
# run is named and tagged. Any other key would continue another run (another model, other data,
# other batches or steps per epoch), or fail to restore its weights.
MAY_CHANGE = (
    "train.epochs",
    "train.resume",
    "train.checkpoint_on_stop",
    "train.terminate_on_nan",
    "measure.",
    "verbose",
    "tracking.run_name",
    "tracking.tags.",
    "tracking.system_metrics",
    "tracking.system_metrics_interval_s",
)


def may_change(key: str) -> bool:
    return any(key == item or (item.endswith(".") and key.startswith(item)) for item in MAY_CHANGE)


def changed_keys(stopped: Dict[str, str], now: Dict[str, str]) -> List[str]:
    """`key=stopped value (now: new value)` for every key that differs and may not change."""
    changed = []
    for key in sorted(set(stopped) | set(now)):
        if stopped.get(key) != now.get(key) and not may_change(key):
            changed.append(f"{key}={stopped.get(key, '(absent)')} (now {now.get(key, '(absent)')})")
    return changed


def load_state(run_folder: Path) -> Optional[ResumeState]:
    """The state of a stopped run in `run_folder`, or None."""
    path = run_folder / FOLDER / STATE
    if not path.is_file():
        return None
    written = json.loads(path.read_text())
    return ResumeState(**{key: value for key, value in written.items() if key in ResumeState.__dataclass_fields__})


def save(run_folder: Path, state: ResumeState, model, optimizer) -> None:
    """The variables first, state.json last (written whole, then renamed): a stop during the save
    leaves no state that points at missing variables."""
    import tensorflow as tf

    folder = run_folder / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(folder / "variables"))
    staging = folder / f".{STATE}.{os.getpid()}"
    staging.write_text(json.dumps(asdict(state)))
    staging.replace(folder / STATE)


def restore(run_folder: Path, model, optimizer) -> None:
    import tensorflow as tf

    tf.train.Checkpoint(model=model, optimizer=optimizer).read(str(run_folder / FOLDER / "variables")).assert_consumed()


def remove(run_folder: Path) -> None:
    """After the resumed run finished: nothing left to resume."""
    import shutil

    shutil.rmtree(run_folder / FOLDER, ignore_errors=True)


def comparable(overrides: Sequence[str]) -> List[str]:
    """The overrides that make two commands the same run (Hydra's own and those that may change left out)."""
    kept = []
    for item in overrides:
        key = item.lstrip("+~").partition("=")[0]
        if not (key.startswith("hydra.") or may_change(key)):
            kept.append(item)
    return kept


def find_resumable(runs_root: Path, overrides: Sequence[str]) -> Optional[Path]:
    """The most recent run folder under `runs_root` (outputs/runs) stopped with these overrides."""
    wanted = comparable(overrides)
    candidates = []
    for path in runs_root.glob(f"*/*/{FOLDER}/{STATE}"):
        state = json.loads(path.read_text())
        if comparable(state["overrides"]) == wanted:
            candidates.append(path.parent.parent)
    return max(candidates, key=lambda folder: (folder / FOLDER / STATE).stat().st_mtime, default=None)
