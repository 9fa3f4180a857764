"""The search's answer read from its trials: the best (one, or the Pareto front), the trials that
learned worse, and the best trial against its start, beyond the noise: every finished repeat of
each, their spread pooled (bwopt.measure.uncertainty), as a sweep compares its sets."""

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bwopt.measure.uncertainty import compare, log_estimate, pooled_log_spread

TASK_OBJECTIVE = "throughput_examples_per_s"  # what bwopt.app.run_job returns
START = "start"  # the user attribute of the trial enqueued with the configured settings
ACCURACY = "val_accuracy"  # the constraint's figure (final_metrics of summary.json)


def against_start(complete: Sequence, best: Sequence, objectives: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The best trial's throughput against the start's (the trial of the configured settings, else the
    first that finished; when that is the best, the runner-up), with the ratio's 95 % interval and a
    word. None without one best by throughput or without a second trial."""
    if list(objectives) != [TASK_OBJECTIVE] or len(best) != 1 or len(complete) < 2:
        return None
    (winner,) = best
    start = next((trial for trial in complete if trial.user_attrs.get(START)), None)
    what = "the start (the configured settings)" if start else "the first trial"
    start = start or min(complete, key=lambda trial: trial.number)
    name, other = f"best trial {winner.number}", start
    if start.number == winner.number:
        name = f"best trial {winner.number}, {what}"
        other = max((t for t in complete if t.number != winner.number), key=lambda t: (t.values[0], -t.number))
        what = "the runner-up"
    # Each trial's finished repeats with their own intervals, their spread pooled, as a sweep's sets are
    repeats = [trial_repeats(trial) for trial in (winner, other)]
    pooled = pooled_log_spread([values for values, _ in repeats])
    comparison = compare(*(log_estimate(values, intervals, pooled) for values, intervals in repeats))
    sentence = comparison.sentence(name[0].upper() + name[1:], f"{what}, trial {other.number}")
    if comparison.word == "no difference detected":
        sentence += ": the search found nothing faster beyond the noise (hydra.launcher.repeats narrows it)"
    fields = {"trial": winner.number, "against_trial": other.number, "ratio": comparison.ratio}
    return {**fields, "ci95": list(comparison.ci95), "word": comparison.word, "sentence": sentence + "."}


REPEATS = f"{TASK_OBJECTIVE}_repeats"  # a trial's user attribute: [[throughput, its ci95 or None], ...]


def trial_repeats(trial) -> Tuple[List[float], List[Optional[List[float]]]]:
    """(throughputs, their runs' 95 % intervals) of a trial's finished repeats; a trial stored
    before they were recorded has its median and its first repeat's interval."""
    recorded = trial.user_attrs.get(REPEATS)
    if recorded:
        return [value for value, _ in recorded], [interval for _, interval in recorded]
    return list(trial.values[:1]), [trial.user_attrs.get(f"{TASK_OBJECTIVE}_ci95")]


def repeat_folders(sweep_dir: Path, first: int, index: int, num_sets: int, repeats: int) -> List[Path]:
    """The folders of the repeats of set `index` of a batch launched from job `first` (bwopt's
    launcher numbers them first * repeats + repeat * num_sets + index)."""
    return [sweep_dir / str(first * repeats + repeat * num_sets + index) for repeat in range(repeats)]


def learned_worse(trials: Sequence, tolerance: float) -> List:
    """The trials whose recorded val_accuracy is more than `tolerance` below the best of `trials`."""
    accuracies = {trial.number: trial.user_attrs.get(ACCURACY) for trial in trials}
    best = max((accuracy for accuracy in accuracies.values() if accuracy is not None), default=None)
    # the margin keeps a difference of exactly the tolerance from rounding into a flag
    return [
        trial
        for trial in trials
        if None not in (best, accuracies[trial.number]) and best - accuracies[trial.number] > tolerance + 1e-9
    ]


def best_trials(trials: Sequence, directions: Sequence[str]) -> List:
    """One best trial (the first of a tie) for one objective; the Pareto front for several."""
    signs = [1.0 if direction == "maximize" else -1.0 for direction in directions]

    def score(trial) -> List[float]:
        return [sign * value for sign, value in zip(signs, trial.values)]

    if len(directions) == 1:
        return [max(trials, key=lambda trial: (score(trial)[0], -trial.number))] if trials else []

    def dominates(other, trial) -> bool:
        return all(a >= b for a, b in zip(score(other), score(trial))) and score(other) != score(trial)

    return [trial for trial in trials if not any(dominates(other, trial) for other in trials)]
