"""Stop and resume: a run stopped by a signal (a scheduler's preemption) keeps its state in its folder,
and the same run resumes from it, continuing the same MLflow run.

What is kept, in `<run folder>/checkpoint/`: the model's and the optimizer's variables at the stop
(`tf.train.Checkpoint`), and `state.json`: the MLflow run id, the epochs finished, the step times of
those epochs, the last finished epoch's metrics and the run's overrides. A resumed run starts at the
first unfinished epoch (the steps of the epoch that was cut short run again, on the weights as they
were at the stop), so it ends with the same total steps and its figures cover every epoch.
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
    epoch_metrics: Dict[str, float] = field(default_factory=dict)
    overrides: List[str] = field(default_factory=list)


def load_state(run_folder: Path) -> Optional[ResumeState]:
    """The state of a stopped run in `run_folder`, or None."""
    path = run_folder / FOLDER / STATE
    return ResumeState(**json.loads(path.read_text())) if path.is_file() else None


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
    """The overrides that make two commands the same run (train.resume and Hydra's own left out)."""
    return [item for item in overrides if not item.lstrip("+~").startswith(("train.resume=", "hydra."))]


def find_resumable(runs_root: Path, overrides: Sequence[str]) -> Optional[Path]:
    """The most recent run folder under `runs_root` (outputs/runs) stopped with these overrides."""
    wanted = comparable(overrides)
    candidates = []
    for path in runs_root.glob(f"*/*/{FOLDER}/{STATE}"):
        state = json.loads(path.read_text())
        if comparable(state["overrides"]) == wanted:
            candidates.append(path.parent.parent)
    return max(candidates, key=lambda folder: (folder / FOLDER / STATE).stat().st_mtime, default=None)
