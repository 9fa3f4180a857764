"""bwopt's Hydra sweeper: an Optuna search whose trials run through the configured launcher.

`python -m bwopt -m hparams_search=pipeline` selects it (`hydra/sweeper=bwopt_optuna`). Why not
hydra-optuna-sweeper: it pins optuna<3 (2.10, 2021), whose sqlite storage fails under the
SQLAlchemy 2 that MLflow 3 installs, so its studies could not be stored or resumed here.

The search space is Hydra's sweep syntax, in `hydra.sweeper.params` or on the command line (the
command line wins for a key it names):

- `choice(0, 2, autotune)` or `0,2,autotune`: a categorical parameter;
- `range(1, 9)`: the integers 1..8 (`range(1, 9, 2)`: every second one);
- `interval(0.0001, 0.1)`: a float; `tag(log, interval(...))` samples it log-uniformly,
  `tag(int, interval(1, 64))` as an integer.

Any other override is fixed: every trial gets it as given.

Each batch of `n_jobs` trials is asked of the study, launched (bwopt's launcher: each a fresh
process, a child run of the search's parent run; job folder n is trial n), and told its values.
A value is read from the trial's job: `throughput_examples_per_s`, the app's objective, is the
job's return value (the launcher's median over repeats); any other name is looked up in the job
folder's summary.json (`figures`, `measurements`, `final_metrics`, e.g. `val_accuracy`,
`step_time_p50_s`), from the first repeat. A trial whose job failed, or whose value is NaN (the
app returns NaN when nothing was timed) or missing, is told FAILED and the search goes on.

With `storage` (an Optuna URL such as sqlite:///outputs/optuna.db) and `study_name`, a second
invocation loads the study and adds `n_trials` more; its sampler seed is shifted by the number of
trials already there, so it does not replay the first invocation's random start-up trials.

At the end `search.yaml` in the sweep folder (and on the parent run) holds the best trial: its
overrides and values, or with several objectives the Pareto front. A search in which no trial
finished raises (Hydra then exits non-zero); one with some failed trials does not.
"""

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

TASK_OBJECTIVE = "throughput_examples_per_s"  # what bwopt.app.run_job returns
SUMMARY_SECTIONS = ("figures", "measurements", "final_metrics")
DIRECTIONS = ("maximize", "minimize")


def _tpe(seed: Optional[int]):
    import optuna

    return optuna.samplers.TPESampler(seed=seed)


def _random(seed: Optional[int]):
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


SAMPLERS = {"tpe": _tpe, "random": _random}


@dataclass
class BwoptSweeperConf:
    """`hydra.sweeper.*` when `hydra/sweeper=bwopt_optuna`.

    Attributes:
        n_trials: trials this invocation adds to the study.
        n_jobs: trials asked for and launched together (with `hydra.launcher.max_parallel` they
            run side by side; 1 lets every trial learn from all earlier ones).
        sampler: tpe or random.
        seed: the sampler's seed (null: a fresh one each time).
        objectives: what each trial is scored by (see the module doc); several give a Pareto front.
        directions: maximize or minimize, one per objective.
        storage: an Optuna storage URL (e.g. sqlite:///outputs/optuna.db); null keeps the study in memory.
        study_name: the study to create, or to load and extend from `storage`.
        params: the search space, `key: sweep` in Hydra's override syntax.
    """

    _target_: str = "hydra_plugins.bwopt_sweeper.bwopt_sweeper.BwoptSweeper"
    n_trials: int = 20
    n_jobs: int = 1
    sampler: str = "tpe"
    seed: Optional[int] = 0
    objectives: List[str] = field(default_factory=lambda: [TASK_OBJECTIVE])
    directions: List[str] = field(default_factory=lambda: ["maximize"])
    storage: Optional[str] = None
    study_name: str = "bwopt"
    params: Dict[str, str] = field(default_factory=dict)


class SearchConfigError(ValueError):
    """A sweeper setting or a search-space override that cannot be searched."""


def distribution(override: Override):
    """The Optuna distribution of one sweep override (choice, range, interval)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    sweep = override.value()
    if isinstance(sweep, ChoiceSweep):
        choices = list(override.sweep_iterator())
        if not all(choice is None or isinstance(choice, (bool, int, float, str)) for choice in choices):
            raise SearchConfigError(f"{override.input_line}: choices must be plain values (numbers, strings, bools)")
        return CategoricalDistribution(choices)
    if isinstance(sweep, RangeSweep):
        values = list(override.sweep_iterator())
        if not values or not all(isinstance(value, int) for value in values):
            raise SearchConfigError(f"{override.input_line}: range() must give integers; use interval() for floats")
        if len(values) == 1:
            return CategoricalDistribution(values)
        return IntDistribution(values[0], values[-1], step=int(sweep.step))
    if isinstance(sweep, IntervalSweep):
        log_scale = "log" in sweep.tags
        if "int" in sweep.tags:
            return IntDistribution(int(sweep.start), int(sweep.end), log=log_scale)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log_scale)
    raise SearchConfigError(f"{override.input_line}: only choice(), range() and interval() can be searched")


def search_space(params: Dict[str, str], arguments: Sequence[str]) -> Tuple[List[str], Dict[str, Any]]:
    """Fixed overrides (as typed) and the distributions by override key, from params then the command line."""
    lines = {key: f"{key}={value}" for key, value in params.items()}
    parser = OverridesParser.create()
    for override in parser.parse_overrides(list(arguments)):
        lines[override.get_key_element()] = override.input_line
    fixed, space = [], {}
    for override in parser.parse_overrides(list(lines.values())):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(override.input_line)
    if not space:
        raise SearchConfigError("nothing to search: give hydra.sweeper.params or a sweep such as key=choice(a,b)")
    return fixed, space


def override_value(value) -> str:
    """A sampled value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not value.replace("_", "").replace("-", "").replace(".", "").isalnum():
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def trial_overrides(fixed: Sequence[str], params: Dict[str, Any]) -> List[str]:
    return [*fixed, *(f"{key}={override_value(value)}" for key, value in params.items())]


def job_folder(result: JobReturn) -> Path:
    sweep = result.hydra_cfg.hydra.sweep
    return Path(str(sweep.dir)) / str(sweep.subdir)


def summary_value(folder: Path, name: str) -> Optional[float]:
    """A figure of the job's summary.json by name, from any of its sections; None when it has none."""
    summary_file = folder / "summary.json"
    if not summary_file.is_file():
        return None
    summary = json.loads(summary_file.read_text())
    for section in SUMMARY_SECTIONS:
        value = (summary.get(section) or {}).get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def trial_values(result: JobReturn, objectives: Sequence[str]) -> Tuple[Optional[List[float]], str]:
    """The trial's value per objective, or None and why the trial failed."""
    if result.status is not JobStatus.COMPLETED:
        return None, f"the job failed: {result._return_value}"
    returned = result.return_value
    if not isinstance(returned, (int, float)) or math.isnan(returned):
        return None, f"the job returned {returned!r}: nothing was measured"
    values = []
    for name in objectives:
        value = float(returned) if name == TASK_OBJECTIVE else summary_value(job_folder(result), name)
        if value is None or math.isnan(value):
            return None, f"no value for {name} in {job_folder(result) / 'summary.json'}"
        values.append(value)
    return values, ""


class OptunaSearch(Sweeper):
    """The sweeper behind `hydra/sweeper=bwopt_optuna` (Hydra instantiates its subclass in hydra_plugins)."""

    def __init__(
        self,
        n_trials: int,
        n_jobs: int,
        sampler: str,
        seed: Optional[int],
        objectives: List[str],
        directions: List[str],
        storage: Optional[str],
        study_name: str,
        params: Dict[str, str],
    ) -> None:
        if n_trials < 1 or n_jobs < 1:
            raise SearchConfigError(f"hydra.sweeper.n_trials={n_trials} and n_jobs={n_jobs} must both be >= 1")
        if sampler not in SAMPLERS:
            raise SearchConfigError(f"hydra.sweeper.sampler={sampler!r}: expected one of {', '.join(SAMPLERS)}")
        if len(objectives) != len(directions) or not objectives:
            raise SearchConfigError(
                f"hydra.sweeper.objectives={list(objectives)} and directions={list(directions)} need one direction"
                " per objective"
            )
        if not set(directions) <= set(DIRECTIONS):
            raise SearchConfigError(f"hydra.sweeper.directions={list(directions)}: each is maximize or minimize")
        self.n_trials, self.n_jobs, self.sampler, self.seed = n_trials, n_jobs, sampler, seed
        self.objectives, self.directions = list(objectives), list(directions)
        self.storage, self.study_name = storage, study_name
        self.params = {str(key): str(value) for key, value in (params or {}).items()}
        self.config: Optional[DictConfig] = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        with open_dict(config):  # one folder for every batch, whatever the clock says later
            config.hydra.sweep.dir = str(config.hydra.sweep.dir)
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        if hasattr(self.launcher, "parent_name"):  # bwopt's launcher: name the parent run after the study
            self.launcher.parent_name = f"search {self.study_name}"

    def sweep(self, arguments: List[str]) -> Any:
        fixed, space = search_space(self.params, arguments)
        study = self._study()
        log.info(
            f"Study '{self.study_name}' ({len(study.trials)} trials so far): {self.n_trials} more, "
            f"{' '.join(f'{d} {o}' for o, d in zip(self.objectives, self.directions))}"
        )
        for first in range(0, self.n_trials, self.n_jobs):
            self._run_batch(study, fixed, space, min(self.n_jobs, self.n_trials - first))
        return self._finish(study)

    def _study(self):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if self.storage is None:
            return optuna.create_study(directions=self.directions, sampler=SAMPLERS[self.sampler](self.seed))
        if self.study_name not in optuna.study.get_all_study_names(self.storage):
            return optuna.create_study(
                storage=self.storage,
                study_name=self.study_name,
                directions=self.directions,
                sampler=SAMPLERS[self.sampler](self.seed),
            )
        study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        if [direction.name.lower() for direction in study.directions] != self.directions:
            raise SearchConfigError(
                f"study '{self.study_name}' in {self.storage} has directions "
                f"{[d.name.lower() for d in study.directions]}, not {self.directions}: use another study_name"
            )
        seed = None if self.seed is None else self.seed + len(study.trials)  # no replay of the start-up trials
        study.sampler = SAMPLERS[self.sampler](seed)
        return study

    def _run_batch(self, study, fixed: List[str], space: Dict[str, Any], size: int) -> None:
        from optuna.trial import TrialState

        trials = [study.ask(space) for _ in range(size)]
        overrides = [trial_overrides(fixed, trial.params) for trial in trials]
        for trial, trial_override in zip(trials, overrides):
            trial.set_user_attr("overrides", trial_override)
        try:
            # folder n is trial n (with one worker on the study, trial numbers are consecutive)
            results = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
        except BaseException:  # stopped or broken: no trial may stay RUNNING in the storage
            for trial in trials:
                study.tell(trial, state=TrialState.FAIL)
            raise
        for trial, result in zip(trials, results):
            values, why = trial_values(result, self.objectives)
            if values is None:
                log.warning(f"trial {trial.number} failed: {why}")
                study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_user_attr("job_folder", str(job_folder(result)))
            study.tell(trial, values)
            log.info(f"trial {trial.number}: {dict(zip(self.objectives, values))}")

    def _finish(self, study) -> Dict[str, Any]:
        """Write search.yaml (the best trial, or the Pareto front) into the sweep folder and onto the parent run."""
        from optuna.trial import TrialState

        states = [trial.state for trial in study.trials]
        best = []
        if TrialState.COMPLETE in states:  # one best trial (the first of a tie), or the Pareto front
            best = [study.best_trial] if len(self.objectives) == 1 else study.best_trials
        results = {
            "study_name": self.study_name,
            "storage": self.storage,
            "objectives": dict(zip(self.objectives, self.directions)),
            "num_trials": len(states),
            "num_complete": states.count(TrialState.COMPLETE),
            "num_failed": states.count(TrialState.FAIL),
            "best": [
                {
                    "trial": trial.number,
                    "values": dict(zip(self.objectives, trial.values)),
                    "params": {key: override_value(value) for key, value in trial.params.items()},
                    "overrides": trial.user_attrs.get("overrides", []),
                    "job_folder": trial.user_attrs.get("job_folder"),
                }
                for trial in sorted(best, key=lambda trial: trial.number)
            ],
        }
        path = Path(str(self.config.hydra.sweep.dir)) / "search.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(results)))
        for item in results["best"]:
            log.info(f"Best overrides (trial {item['trial']}): {' '.join(item['overrides'])}  {item['values']}")
        parent = getattr(self.launcher, "parent", None)
        if parent is not None:
            parent.annotate([path], {"bwopt.study_name": self.study_name})
        if not best:  # a search that measured nothing is an error (exit code 1), not an answer
            raise RuntimeError(f"no trial of study '{self.study_name}' finished; see the sweep report next to {path}")
        return results
