"""bwopt's Hydra sweeper: an Optuna search whose trials run through the configured launcher.

`python -m bwopt -m hparams_search=pipeline` selects it (`hydra/sweeper=bwopt_optuna`). Why not
hydra-optuna-sweeper: it pins optuna<3 (2.10, 2021), whose sqlite storage fails under the
SQLAlchemy 2 that MLflow 3 installs, so its studies could not be stored or resumed here.

The search space is Hydra's sweep syntax (choice, range, interval: bwopt.sweep.space), in
`hydra.sweeper.params` or on the command line (the command line wins for a key it names). Any
other override is fixed: every trial gets it as given. A space that cannot be searched, or a bad
sweeper setting, is one line and exit 2, before anything runs. A new study's first trial is the
configured settings (the start), when every searched key has a value in its range.

Each batch of `n_jobs` trials is asked of the study, launched (bwopt's launcher: each a fresh
process, a child run of the search's parent run, as under another launcher through
bwopt.sweep.sweeper.ParentBeside; job folder n is trial n, a finished trial's
`job_folder`), and told its values. Before a trial is launched, bwopt's schema checks its
configuration (no TensorFlow): a searched value that is refused only beside others
(`pipeline.vectorized_map=true` where `pipeline.preprocess=imagenet`) is not run. That trial is
told PRUNED with the reason (its `refused` attribute; TPE ranks pruned trials below every finished
one and learns to sample elsewhere), logged in one line, counted as `num_refused` in search.yaml
and replaced: `n_trials` counts trials that ran. A refused trial inside a batch of several shifts
its batch's later folders down by one. After 100 refusals in a row the search stops: an error
(exit 2) when nothing has run, else a warning and the search's result so far.

A value is read from the trial's job: `throughput_examples_per_s`, the app's objective, is the
job's return value (the launcher's median over repeats); any other name is looked up in the job
folder's summary.json (`figures`, `measurements`, `final_metrics`, e.g. `val_accuracy`,
`step_time_p50_s`), from the first repeat. A trial whose job failed, or whose value is NaN (the
app returns NaN when nothing was timed) or missing, is told FAILED and the search goes on. Each
trial also keeps every finished repeat's throughput and interval, from which the best is
compared with the start (their spread pooled, as a sweep compares its sets).

With `storage` (an Optuna URL such as sqlite:///outputs/optuna.db) and `study_name`, a second
invocation loads the study and adds `n_trials` more; its sampler seed is shifted by the number of
trials already there, so it does not replay the first invocation's random start-up trials.

Accuracy is a constraint: each trial's final `val_accuracy` (summary.json) is recorded, and a trial
whose accuracy is more than `sweep.accuracy_tolerance` below the best of the study learned worse:
its settings changed what the model learned, not only how fast it was fed. Such a trial is logged
when it finishes (against the best so far), listed under `learned_worse` and is never the best
(nor on the Pareto front), however fast. When val_accuracy is itself an objective, the front
trades it off openly and the constraint is not applied; `sweep.accuracy_tolerance=1` turns it off.

At the end `search.yaml` in the sweep folder (and on the parent run) holds the best trial: its
overrides, values and val_accuracy, or with several objectives the Pareto front; by throughput,
`against_start` compares it with the start (else the first trial; the runner-up when the start is
best): the ratio, its 95 % interval and a word, faster / slower / no difference detected, the
sentence logged and leading the parent run's description. A search in which no trial finished
raises (Hydra then exits non-zero); one with some failed trials does not.
"""

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from bwopt.schema import SweepConfig
from bwopt.sweep.results import read_job, read_summary, summary_value
from bwopt.sweep.search_start import (
    ACCURACY,
    REPEATS,
    START,
    TASK_OBJECTIVE,
    against_start,
    best_trials,
    learned_worse,
    repeat_folders,
)
from bwopt.sweep.space import (  # noqa: F401 (distribution: part of this module's interface)
    SearchConfigError,
    configured_params,
    distribution,
    override_value,
    search_space,
    trial_overrides,
)
from bwopt.sweep.sweeper import SweepFailed, prepare_sweep, refusal_of, runs_bwopt

log = logging.getLogger(__name__)

REFUSED = "refused"  # a trial's user attribute: why the schema refused its configuration
# Sampled configurations the schema may refuse in a row before the search gives up on its space.
MAX_REFUSED_IN_A_ROW = 100
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

    The sweeper's settings too: Hydra passes these keys to OptunaSearch, which builds this from them.
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

    def __post_init__(self) -> None:
        if self.n_trials < 1 or self.n_jobs < 1:
            raise SearchConfigError(
                f"hydra.sweeper.n_trials={self.n_trials} and n_jobs={self.n_jobs} must both be >= 1"
            )
        if self.sampler not in SAMPLERS:
            raise SearchConfigError(f"hydra.sweeper.sampler={self.sampler!r}: expected one of {', '.join(SAMPLERS)}")
        # Hydra passes lists and dicts as OmegaConf containers: plain ones from here on
        self.objectives, self.directions = list(self.objectives), list(self.directions)
        self.params = {str(key): str(value) for key, value in (self.params or {}).items()}
        if len(self.objectives) != len(self.directions) or not self.objectives:
            raise SearchConfigError(
                f"hydra.sweeper.objectives={self.objectives} and directions={self.directions} need one direction"
                " per objective"
            )
        if not set(self.directions) <= set(DIRECTIONS):
            raise SearchConfigError(f"hydra.sweeper.directions={self.directions}: each is maximize or minimize")


def job_folder(result: JobReturn) -> Path:
    sweep = result.hydra_cfg.hydra.sweep
    return Path(str(sweep.dir)) / str(sweep.subdir)


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

    def __init__(self, **settings: Any) -> None:
        """settings: the keys of BwoptSweeperConf (`hydra.sweeper.*`), as Hydra instantiates the sweeper."""
        try:
            self.settings = BwoptSweeperConf(**settings)
        except SearchConfigError as error:  # Hydra would wrap it in a traceback: one line, as for any key
            print(f"bwopt: invalid config: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.checks_schema = False  # bwopt's own task: each sampled configuration is validated first
        self.accuracy_tolerance = SweepConfig().accuracy_tolerance  # sweep.accuracy_tolerance, read in setup
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.checks_schema = runs_bwopt(task_function)
        self.accuracy_tolerance, self.launcher = prepare_sweep(
            config, hydra_context, task_function, parent_name=f"search {self.settings.study_name}"
        )

    def sweep(self, arguments: List[str]) -> Any:
        from optuna.trial import TrialState

        settings = self.settings
        try:
            fixed, space = search_space(settings.params, arguments)
            study = self._study()
        except SearchConfigError as error:  # one line and exit 2, as for any bad key
            print(f"bwopt: invalid config: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        self._enqueue_start(study, space)
        if hasattr(self.launcher, "swept_keys"):  # bwopt's launcher: trial runs named by the searched keys
            self.launcher.swept_keys = list(space)
        log.info(
            f"Study '{settings.study_name}' ({len(study.trials)} trials so far): {settings.n_trials} more, "
            f"{' '.join(f'{d} {o}' for o, d in zip(settings.objectives, settings.directions))}"
        )
        try:
            for first in range(0, settings.n_trials, settings.n_jobs):
                self._run_batch(study, fixed, space, min(settings.n_jobs, settings.n_trials - first))
        except SearchConfigError as error:
            if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                print(f"bwopt: invalid config: {error}", file=sys.stderr)
                raise SystemExit(2) from None
            log.warning(f"search stopped: {error}")
        return self._finish(study)

    def _study(self):
        import optuna

        settings, sampler = self.settings, SAMPLERS[self.settings.sampler]
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if settings.storage is None:
            return optuna.create_study(directions=settings.directions, sampler=sampler(settings.seed))
        if settings.study_name not in optuna.study.get_all_study_names(settings.storage):
            return optuna.create_study(
                storage=settings.storage,
                study_name=settings.study_name,
                directions=settings.directions,
                sampler=sampler(settings.seed),
            )
        study = optuna.load_study(study_name=settings.study_name, storage=settings.storage)
        if [direction.name.lower() for direction in study.directions] != settings.directions:
            raise SearchConfigError(
                f"study '{settings.study_name}' in {settings.storage} has directions "
                f"{[d.name.lower() for d in study.directions]}, not {settings.directions}: use another study_name"
            )
        seed = None if settings.seed is None else settings.seed + len(study.trials)  # no replay of the start-up trials
        study.sampler = sampler(seed)
        return study

    def _enqueue_start(self, study, space: Dict[str, Any]) -> None:
        """A new study's first trial is the configured settings (when each searched key has a value in
        its range): the start, which the best trial is compared with at the end."""
        if study.trials:
            return
        configured = {key: OmegaConf.select(self.config, key.lstrip("+~")) for key in space}
        params = configured_params(space, configured)
        if params is not None:
            study.enqueue_trial(params, user_attrs={START: True})

    def _ask(self, study, fixed: List[str], space: Dict[str, Any]):
        """The next trial whose configuration bwopt's schema accepts (checked without TensorFlow).

        A searched value can be refused only beside others (`pipeline.vectorized_map=true` with
        `pipeline.preprocess=imagenet`): such a trial is not run, it is told PRUNED with the reason
        (TPE ranks pruned trials below every finished one, so it learns to sample elsewhere) and
        another is asked; it does not count toward `n_trials`."""
        from optuna.trial import TrialState

        for _ in range(MAX_REFUSED_IN_A_ROW):
            trial = study.ask(space)
            overrides = trial_overrides(fixed, trial.params)
            trial.set_user_attr("overrides", overrides)
            why = refusal_of(self.hydra_context, self.config, overrides) if self.checks_schema else None
            if why is None:
                return trial
            trial.set_user_attr(REFUSED, why)
            study.tell(trial, state=TrialState.PRUNED)
            log.warning(f"trial {trial.number} not run, its configuration refused: {why}")
        raise SearchConfigError(
            f"{MAX_REFUSED_IN_A_ROW} sampled configurations in a row were refused, the last: {why}; "
            "narrow the search space"
        )

    def _run_batch(self, study, fixed: List[str], space: Dict[str, Any], size: int) -> None:
        from optuna.trial import TrialState

        trials = []
        try:
            while len(trials) < size:
                trials.append(self._ask(study, fixed, space))
        except SearchConfigError:  # the batch's trials asked so far must not stay RUNNING in the storage
            for trial in trials:
                study.tell(trial, state=TrialState.FAIL)
            raise
        overrides = [trial.user_attrs["overrides"] for trial in trials]
        try:
            # folders from the first trial's number on: trial n's is n unless a refused trial came before it here
            results = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
        except BaseException:  # stopped or broken: no trial may stay RUNNING in the storage
            for trial in trials:
                study.tell(trial, state=TrialState.FAIL)
            raise
        for trial, result in zip(trials, results):
            values, why = trial_values(result, self.settings.objectives)
            if values is None:
                log.warning(f"trial {trial.number} failed: {why}")
                study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_user_attr("job_folder", str(job_folder(result)))
            figures = (read_summary(job_folder(result)) or {}).get("figures") or {}
            if figures.get(f"{TASK_OBJECTIVE}_ci95"):
                trial.set_user_attr(f"{TASK_OBJECTIVE}_ci95", list(figures[f"{TASK_OBJECTIVE}_ci95"]))
            repeats = getattr(self.launcher, "repeats", 1)
            folders = repeat_folders(
                job_folder(result).parent, trials[0].number, trials.index(trial), len(trials), repeats
            )
            finished = [job for job in map(read_job, folders) if job.throughput is not None]
            trial.set_user_attr(REPEATS, [[job.throughput, job.throughput_ci95] for job in finished])
            accuracy = summary_value(job_folder(result), ACCURACY)
            if accuracy is not None:
                trial.set_user_attr(ACCURACY, accuracy)
            study.tell(trial, values)
            log.info(f"trial {trial.number}: {dict(zip(self.settings.objectives, values))}")
            self._warn_if_learned_worse(study, trial)

    def _constrained(self) -> bool:
        return ACCURACY not in self.settings.objectives

    def _warn_if_learned_worse(self, study, trial) -> None:
        from optuna.trial import TrialState

        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if self._constrained() and trial.number in [
            other.number for other in learned_worse(complete, self.accuracy_tolerance)
        ]:
            log.warning(
                f"trial {trial.number} learned worse: val_accuracy {trial.user_attrs[ACCURACY]:.4f} is more than "
                f"{self.accuracy_tolerance:g} (sweep.accuracy_tolerance) below the best so far; it cannot be the best"
            )

    def _finish(self, study) -> Dict[str, Any]:
        """Write search.yaml (the best trial, or the Pareto front) into the sweep folder and onto the parent run."""
        from optuna.trial import TrialState

        settings = self.settings
        states = [trial.state for trial in study.trials]
        complete = [trial for trial in study.trials if trial.state is TrialState.COMPLETE]
        worse = learned_worse(complete, self.accuracy_tolerance) if self._constrained() else []
        eligible = [trial for trial in complete if trial.number not in {other.number for other in worse}]
        best = best_trials(eligible, settings.directions)
        results = {
            "study_name": settings.study_name,
            "storage": settings.storage,
            "objectives": dict(zip(settings.objectives, settings.directions)),
            "num_trials": len(states),
            "num_complete": states.count(TrialState.COMPLETE),
            "num_failed": states.count(TrialState.FAIL),
            "num_refused": len([trial for trial in study.trials if REFUSED in trial.user_attrs]),
            "best": [
                {
                    "trial": trial.number,
                    "values": dict(zip(settings.objectives, trial.values)),
                    "params": {key: override_value(value) for key, value in trial.params.items()},
                    "overrides": trial.user_attrs.get("overrides", []),
                    "job_folder": trial.user_attrs.get("job_folder"),
                    ACCURACY: trial.user_attrs.get(ACCURACY),
                }
                for trial in sorted(best, key=lambda trial: trial.number)
            ],
            "accuracy_tolerance": self.accuracy_tolerance if self._constrained() else None,
            "learned_worse": [
                {"trial": item.number, ACCURACY: item.user_attrs[ACCURACY], "overrides": item.user_attrs["overrides"]}
                for item in worse
            ],
        }
        comparison = against_start(complete, best, settings.objectives)
        results["against_start"] = comparison
        path = Path(str(self.config.hydra.sweep.dir)) / "search.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(results)))
        for item in results["best"]:
            log.info(f"Best overrides (trial {item['trial']}): {' '.join(item['overrides'])}  {item['values']}")
        if comparison:
            log.info(comparison["sentence"])
        parent = getattr(self.launcher, "parent", None)
        if parent is not None:
            parent.annotate([path], {"bwopt.study_name": settings.study_name})
            if comparison:
                parent.lead_description(comparison["sentence"])
        if not best:  # a search that measured nothing is an error (exit code 1), not an answer
            raise SweepFailed(
                f"bwopt: search failed: no trial of study '{settings.study_name}' finished; each failed job's "
                f"line above says why; see the sweep report next to {path}"
            )
        return results
