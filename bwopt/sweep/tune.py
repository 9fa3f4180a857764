"""bwopt's tuner: measure, change, verify; `python -m bwopt -m tune=pipeline [the workload's overrides]`.

The Hydra sweeper behind `hydra/sweeper=bwopt_tuner` (conf/tune/pipeline.yaml selects it). Its
trials run through the configured launcher (bwopt's: a fresh process each, a child run of one
MLflow parent run, the sweep report; another keeps the parent run and report through
bwopt.sweep.sweeper.ParentBeside), one at a time, each with `measure.ceilings=true`:

1. the start: the workload as given; then the pipeline alone is probed in a fresh process for its
   per-stage costs (bwopt.sweep.tune_probe: tf.data's own performance model of the iterator);
2. the proposals (bwopt.sweep.tune_plan): greedy by the gain the cost model predicts, each with
   its reason, planned again after every revert on top of the changes kept; only settings that
   keep the examples and the math (parallelism, prefetch, cache before every random stage,
   vectorised maps, a lossless transfer dtype, interleave width, steps per execution, batches
   fetched to a GPU), then, only as `hydra.sweeper.allow` lets in, a 16-bit policy (`precision`),
   a larger batch with its learning rate scaled (`batch_size`) and JPEGs decoded whole into a
   cache instead of only their random crop windows (`decode`), all tried past the target too;
3. each proposal runs on top of the incumbent, its repeats around as many runs of the incumbent
   (`rerun_incumbent`), and is kept only when it is faster beyond the noise
   (bwopt.measure.uncertainty.compare of the two trials' estimates: each run's own interval, the
   spread between runs of one setting in one round, pooled over every trial so far or the
   setting's own where it scatters more, and the machine's drift between rounds, which the
   incumbent's runs beside later candidates measure)
   and learned as well (val_accuracy within `sweep.accuracy_tolerance` of the start's); a
   comparison that is undecided but leans the candidate's way gets another round (up to
   `extra_rounds`), every look at Pocock's level so that the looks together err no more often
   than one 95 % comparison; otherwise the candidate is reverted, and the table says so; changes
   reverted within the noise run again as one change once none is left (`tune_plan.together`);
4. it stops when the incumbent reaches `target_fraction` of its compute ceiling (the input side
   has nothing left to give), when no proposal is left, or after `max_trials` trials.

At the end the sweep folder holds tuned.yaml (`python -m bwopt $(cat tuned.yaml)`), the same as an
experiment config in experiment/tuned.yaml (`python -m bwopt -cd SWEEP_FOLDER experiment=tuned`),
tune.md (the table, the per-stage picture and the closing line) and tune_path.png; the parent run
gets them as artifacts, the table as its description and the result as metrics.
"""

import json
import logging
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from bwopt.measure.host import available_cores
from bwopt.measure.uncertainty import sequential_level
from bwopt.memory import available_memory_bytes
from bwopt.schema import SweepConfig
from bwopt.sweep.sweeper import SweepFailed, prepare_sweep
from bwopt.sweep.tune_decide import Budget, Proposal
from bwopt.sweep.tune_plan import OPT_IN_NAMES, busy_cores_reason, plan, together
from bwopt.sweep.tune_plot import plot_path
from bwopt.sweep.tune_record import (
    Trial,
    against,
    cores_used,
    drift_spread,
    pool_intervals,
    read_repeats,
    run_to_run_spread,
)
from bwopt.sweep.tune_setup import (
    BwoptTunerConf,
    TuneConfigError,
    profile_of,
    run_probe,
    start_knobs,
    workload_overrides,
)
from bwopt.sweep.tune_text import (
    closing_line,
    noise_sentence,
    ratio_text,
    rounds_note,
    rounds_sentence,
    slow_sentence,
    stage_table,
    table,
    tuned_overrides,
    write_experiment,
    write_tuned,
)

log = logging.getLogger(__name__)

MEASURING = ["measure.ceilings=true"]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class PipelineTuner(Sweeper):
    """The sweeper behind `hydra/sweeper=bwopt_tuner` (Hydra instantiates its subclass in hydra_plugins)."""

    def __init__(self, **settings: Any) -> None:
        try:
            self.settings = BwoptTunerConf(**settings)
        except TuneConfigError as error:  # one line, as for any key
            print(f"bwopt: invalid config: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        self.config: Optional[DictConfig] = None
        self.config_loader = None  # Hydra's, from setup: it composes experiment/tuned.yaml to check it
        self.launcher = None
        self.accuracy_tolerance = SweepConfig().accuracy_tolerance
        self.sweep_dir = Path(".")
        self.probe_file = self.sweep_dir / "tune_probe_start.json"
        self.trials: List[Trial] = []
        self.launched = 0  # runs so far: the next one's job folder
        self.rounds = 0  # rounds so far: the next one's block
        self.level = sequential_level(1 + self.settings.extra_rounds)  # each look's, Pocock's
        self.extended: List[int] = []  # trials that ran an extra round
        self.skipped: List[str] = []
        # `tune=NAME` goes to every trial (as `hparams_search=` does to the search's): a job composes
        # the command line's hydra.sweeper.* overrides, which only this sweeper's schema has.
        self.selection: List[str] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.config_loader = hydra_context.config_loader
        self.accuracy_tolerance, self.launcher = prepare_sweep(
            config, hydra_context, task_function, parent_name="tune pipeline"
        )
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.probe_file = self.sweep_dir / "tune_probe_start.json"
        choice = OmegaConf.select(config, "hydra.runtime.choices.tune")
        self.selection = [f"tune={choice}"] if choice else []
        if hasattr(self.launcher, "log_ranking"):  # each trial's own comparison is the word, not the folder's
            self.launcher.log_ranking = False
        launcher_repeats = getattr(self.launcher, "repeats", 1)
        if launcher_repeats != 1:  # the tuner repeats its trials itself, with any launcher
            print(
                f"bwopt: invalid config: hydra.launcher.repeats={launcher_repeats}; tune repeats each trial "
                f"itself (expected 1; set hydra.sweeper.repeats, now {self.settings.repeats})",
                file=sys.stderr,
            )
            raise SystemExit(2)

    def sweep(self, arguments: List[str]) -> Any:
        started = time.monotonic()
        try:
            base = workload_overrides(arguments)
        except TuneConfigError as error:
            print(f"bwopt: invalid config: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        # whole cores: a thread runs on one at a time (a 1.5-core quota gives one thread per stage)
        budget = Budget(cores=max(1, int(available_cores())), memory_bytes=available_memory_bytes())
        budget = Budget(budget.cores, budget.memory_bytes * self.settings.memory_share)
        start = self._run(base, Trial(0, "start", "the workload as given", {}))
        if start.failed:
            raise SweepFailed(
                f"bwopt: tune failed: the start (the workload as given) left no result in "
                f"{', '.join(map(str, start.folders))}; each failed job's line above says why; see "
                f"{self.sweep_dir / 'report.md'}"
            )
        start.kept = True
        incumbent = start
        next_proposal = self._planner(base, start, budget)
        kept: List[str] = []
        rejected: List[str] = []
        undecided: List[Tuple[Proposal, Trial]] = []  # changes reverted within the noise, not yet run together
        while True:
            # past the target only the opt-in changes (hydra.sweeper.allow) are left to try
            reached = self._reached_target(incumbent)
            proposal = next_proposal(kept, rejected, reached)
            if not reached and (proposal is None or proposal.name in OPT_IN_NAMES) and len(undecided) > 1:
                proposal, undecided = together(undecided), []  # the changes that keep the math come first
            if reached and proposal is None:
                stop = f"reached {self.settings.target_fraction:g} of the compute ceiling"
                break
            while proposal is not None and (reason := busy_cores_reason(proposal.name, incumbent)):
                log.info(f"not tried: {proposal.name} {proposal.overrides}: {reason}")
                self.skipped.append(f"{proposal.name} ({reason})")
                rejected.append(proposal.name)
                proposal = next_proposal(kept, rejected, reached)
            if not self.trials[-1].kept:
                log.info(f"re-planned without {', '.join(rejected)}: next {proposal.name if proposal else 'nothing'}")
            if proposal is None:
                stop = "no proposal left"
                break
            if len(self.trials) >= self.settings.max_trials:
                stop = f"max_trials={self.settings.max_trials}"
                break
            candidate = Trial(
                len(self.trials), proposal.name, proposal.reason, {**incumbent.overrides, **proposal.overrides}
            )
            candidate.predicted_gain = proposal.gain
            self._run(base, candidate, incumbent)
            self._settle(base, candidate, incumbent, start)
            if not proposal.parts:
                (kept if candidate.kept else rejected).append(proposal.name)
                if candidate.undecided and proposal.name not in OPT_IN_NAMES:
                    undecided.append((proposal, candidate))
            elif candidate.kept:  # changes run together: each was reverted alone
                kept += proposal.parts
                rejected = [name for name in rejected if name not in proposal.parts]
            incumbent = candidate if candidate.kept else incumbent
        return self._finish(base, incumbent, stop, time.monotonic() - started)

    def _run(self, base: List[str], trial: Trial, incumbent: Optional[Trial] = None) -> Trial:
        log.info(f"tune trial {trial.number} ({trial.change}): {trial.reason}")
        self._round(base, trial, incumbent)
        self.trials.append(trial)
        return trial

    def _round(self, base: List[str], trial: Trial, incumbent: Optional[Trial] = None) -> None:
        """A round of `trial`: its repeats, each a launch of its own, one after the other whichever the
        launcher; with `rerun_incumbent`, as many runs of `incumbent` in their middle (c, i, i, c), read
        into it too: their scatter is the incumbent's own noise within a round, which its scatter
        across rounds is then measured against (`drift_spread`). A round's runs share their
        minutes: one block of the drift model. Without `rerun_incumbent` no incumbent run measures
        the drift, so a trial's rounds stay one block."""
        rerun = incumbent is not None and self.settings.rerun_incumbent
        if rerun or not trial.blocks:
            block, self.rounds = self.rounds, self.rounds + 1
        else:
            block = trial.blocks[0]
        repeats = self.settings.repeats
        order = [trial] * repeats
        if rerun:
            order[repeats // 2 : repeats // 2] = [incumbent] * repeats
        for who in order:
            if who is incumbent:
                log.info(f"tune trial {incumbent.number} ({incumbent.change}) runs again beside it")
            self._launch(base, who, block)
        read_repeats(trial.folders, trial, trial.blocks)
        if rerun:  # the incumbent's figures, now over its runs spread over the tuning
            read_repeats(incumbent.folders, incumbent, incumbent.blocks)

    def _launch(self, base: List[str], trial: Trial, block: int) -> None:
        """One run of `trial` in round `block`, in the sweep's next job folder; its wall and CPU time
        count to the trial."""
        changes = (f"{key}={value}" for key, value in trial.overrides.items())
        folder = self.sweep_dir / str(self.launched)
        self.launched += 1
        trial.folders.append(folder)
        trial.blocks.append(block)
        cpu_before = children_cpu_s()
        self.launcher.launch([[*self.selection, *base, *MEASURING, *changes]], initial_job_idx=int(folder.name))
        trial.cpu_s += children_cpu_s() - cpu_before
        if (folder / "job.json").is_file():
            trial.wall_s += json.loads((folder / "job.json").read_text()).get("wall_s", 0.0)

    def _planner(self, base: List[str], start: Trial, budget: Budget):
        """(kept, rejected) -> the next proposal, planned from the start's probe on top of what was kept.

        After a revert the plan is made again without the rejected change, so what follows is
        weighed on the incumbent the trials run on, not on a model that assumed the change.
        """
        if not self.settings.probe:
            return lambda kept, rejected, opt_in_only=False: None
        allow = self.settings.allow
        picture = run_probe(base, self.probe_file, whole_decode="decode" in allow)
        configs = [folder / ".hydra" / "config.yaml" for folder in start.folders]
        config_file = next((path for path in configs if path.is_file()), configs[0])  # the repeats' are alike
        knobs = start_knobs(OmegaConf.load(config_file), budget.cores)
        profile = profile_of(picture, start)
        for number, proposal in enumerate(plan(profile, budget, knobs, allow=allow), 1):
            log.info(f"proposal {number}: {proposal.name} {proposal.overrides}: {proposal.reason}")

        def next_proposal(kept: List[str], rejected: List[str], opt_in_only: bool = False):
            proposals = plan(profile, budget, knobs, kept, rejected, allow)
            left = (proposal for proposal in proposals if proposal.name not in kept)
            return next((proposal for proposal in left if not opt_in_only or proposal.name in OPT_IN_NAMES), None)

        return next_proposal

    def _reached_target(self, incumbent: Trial) -> bool:
        ceiling = incumbent.compute_ceiling
        return bool(ceiling and incumbent.throughput >= self.settings.target_fraction * ceiling)

    def _settle(self, base: List[str], candidate: Trial, incumbent: Trial, start: Trial) -> None:
        """Judge the candidate's round; while undecided but leaning its way, up to `extra_rounds` rounds more."""
        for look in range(1, self.settings.extra_rounds + 2):
            last = look > self.settings.extra_rounds
            if not self._judge(candidate, incumbent, start, last) or last:
                return
            log.info(f"tune trial {candidate.number}: leaning its way: one more round")
            self.extended.append(candidate.number)
            self._round(base, candidate, incumbent)

    def _judge(self, candidate: Trial, incumbent: Trial, start: Trial, last: bool) -> bool:
        """Keep the candidate only when it is faster beyond the noise and learned as well as the start;
        True when the comparison is undecided but leans the candidate's way (another round may tell).
        `last`: no round follows this look, so an undecided candidate is logged as not kept."""
        if candidate.failed:
            candidate.note = "the run failed; reverted"
            return False
        pooled = run_to_run_spread(self.trials)
        comparison = against(candidate, incumbent, pooled, drift_spread(self.trials, pooled), self.level)
        candidate.against_incumbent = comparison
        worse = (
            candidate.val_accuracy is not None
            and start.val_accuracy is not None
            and start.val_accuracy - candidate.val_accuracy > self.accuracy_tolerance + 1e-9
        )
        candidate.note = ""
        if worse:
            candidate.note = f"val_accuracy {candidate.val_accuracy:.3f} below the start's {start.val_accuracy:.3f}"
        elif comparison.word != "faster":
            candidate.note = f"{ratio_text(comparison)} the incumbent, {comparison.word}; reverted"
            rounds = max(1, len(candidate.folders) // self.settings.repeats)
            candidate.note += rounds_note(candidate.predicted_gain, comparison, rounds, self.settings.repeats)
        candidate.kept = not worse and comparison.word == "faster"
        candidate.undecided = not worse and comparison.word == "no difference detected"
        leaning = candidate.undecided and comparison.ratio > 1
        verdict = "kept" if candidate.kept else "undecided" if leaning and not last else "not kept"
        log.info(f"tune trial {candidate.number}: {ratio_text(comparison)} the incumbent, {comparison.word}: {verdict}")
        return leaning

    def _finish(self, base: List[str], final: Trial, stop: str, elapsed_s: float) -> Dict[str, Any]:
        start = self.trials[0]
        pooled = run_to_run_spread(self.trials)
        drift = drift_spread(self.trials, pooled)
        pool_intervals(self.trials, pooled)  # the table's and the plot's intervals, as compared
        tuned = write_tuned(self.sweep_dir / "tuned.yaml", base, final.overrides)
        plot = plot_path(self.trials, self.sweep_dir / "tune_path.png")
        line = closing_line(start, final, self.launched, elapsed_s, pooled, drift, len(self.trials))
        experiment = self._write_experiment(tuned_overrides(base, final.overrides), line)
        rounds = rounds_sentence(self.settings.extra_rounds, self.level, sorted(set(self.extended)))
        cores = [f"{trial.number}: {cores_used(trial):.2f}" for trial in self.trials if cores_used(trial) is not None]
        episodes = slow_sentence(self.trials)
        markdown = "\n\n".join(
            [
                f"**{line}**",
                f"Stopped: {stop}. Tuned overrides (`tuned.yaml`): `{' '.join(final.overrides_text())}`",
                table(self.trials),
                # the launcher's own processes only (bwopt's): a cluster's jobs run elsewhere
                *([f"CPU cores used per trial (process CPU time / wall time): {', '.join(cores)}"] if cores else []),
                *([episodes] if episodes else []),
                noise_sentence(self.settings.repeats, pooled, drift),
                *([rounds] if rounds else []),
                *([f"Not tried: {'; '.join(self.skipped)}"] if self.skipped else []),
            ]
        )
        if self.probe_file.is_file():  # what the plan was made from
            picture = json.loads(self.probe_file.read_text())
            markdown += "\n\nThe start's stages (tf.data's model of the running pipeline):\n\n" + stage_table(picture)
            if picture.get("whole_decode_stages"):
                whole = {"stages": picture["whole_decode_stages"]}
                markdown += "\n\nThe same pipeline decoding whole images (`allow=[decode]`):\n\n" + stage_table(whole)
        report = self.sweep_dir / "tune.md"
        report.write_text(markdown + "\n")
        print(line, flush=True)
        probe = [self.probe_file] if self.probe_file.is_file() else []
        self._annotate_parent([tuned, *experiment, report, plot, *probe], markdown, start, final, (pooled, drift))
        return {"tuned": final.overrides, "closing_line": line, "trials": len(self.trials)}

    def _write_experiment(self, overrides: List[str], line: str) -> List[Path]:
        """experiment/tuned.yaml in the sweep folder: tuned.yaml's overrides as an experiment config,
        run with `python -m bwopt -cd SWEEP_FOLDER experiment=tuned` or copied into conf/experiment/."""
        if self.config_loader is None:  # not set up by Hydra: nothing to check the file with
            return []
        path = self.sweep_dir / "experiment" / "tuned.yaml"
        usage = f"python -m bwopt -cd {self.sweep_dir} experiment=tuned (or copied into conf/experiment/)"
        config_name = self.config.hydra.job.config_name
        try:
            why_not = write_experiment(path, overrides, self.config_loader, config_name, [line, usage])
        except Exception as error:  # an extra file: the tuning's report and parent run come first
            why_not = f"{type(error).__name__}: {error}"
        if why_not:
            log.info(f"tune: no experiment/tuned.yaml: {why_not}; tuned.yaml holds the overrides")
            return []
        return [path]

    def _annotate_parent(self, files: List[Path], markdown: str, start: Trial, final: Trial, noise) -> None:
        parent = getattr(self.launcher, "parent", None)
        if parent is None:
            return
        from bwopt.tracking.names import NOTE_TAG
        from bwopt.tracking.sweeps import within_limit

        tags = {NOTE_TAG: within_limit(markdown), "bwopt.tune.tuned": " ".join(final.overrides_text())}
        parent.annotate(files, tags, root=self.sweep_dir)
        metrics = {"tune_num_trials": len(self.trials), "tune_throughput_examples_per_s": final.throughput}
        if final is not start:
            comparison = against(final, start, *noise)
            metrics.update(
                tune_ratio_to_start=comparison.ratio,
                tune_ratio_to_start_ci95_low=comparison.ci95[0],
                tune_ratio_to_start_ci95_high=comparison.ci95[1],
            )
        if final.of_ceiling:
            metrics["tune_fraction_of_ceiling"] = final.of_ceiling
        parent.log_figures(metrics, {})
