"""The Run: one owner for the life of one experiment.

    with Run(config, output_dir, resolved, overrides) as run:  # the workload prepared, then tracking started
        run.build()                                             # the workload built, the checkpoint restored
        run.mode_figures = mode(run.workload, run.loop_hooks())  # the work; it returns what it measured
    run.summary                                                 # status, figures, records: made on leaving

Entering prepares the workload (bwopt.workload: everything that can reject the config) before the
MLflow run exists, then starts it. Leaving picks the status from the exception (none: FINISHED,
KeyboardInterrupt: KILLED, anything else: FAILED), keeps or drops the checkpoint, has the
`Summary` made and recorded once (bwopt.summary) and ends the MLflow run, whatever happened.
"""

import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bwopt.loop import Hook
from bwopt.measure import StepPlan, StepTimer, timing_figures
from bwopt.redact import redact, redact_text
from bwopt.schema import Config
from bwopt.signals import STOP, StopCheck
from bwopt.summary import Summary, record, summarise
from bwopt.tracking import build_tracker, flatten, readable_metrics
from bwopt.workload import Workload

# Figures of each epoch's own steps, logged as `epoch/...` series beside loss and accuracy.
EPOCH_SERIES = ("throughput_examples_per_s", "input_wait_fraction", "step_time_p50_s")


class EpochLog(Hook):
    """Each epoch's metrics, printed and logged to the tracker at step = the epoch's number as printed
    (1, 2, ...), with the epoch's own timing (throughput, input-wait share, step-time p50) beside
    them so that they draw as series; the last epoch's metrics are kept for the summary."""

    def __init__(self, tracker, timer: StepTimer, input_plan, examples_per_step: int) -> None:
        self.tracker = tracker
        self.timer = timer
        self.plan = input_plan.steps
        self.examples_per_step = examples_per_step
        self.bytes_per_step = examples_per_step * input_plan.bytes_per_example
        self.last: Dict[str, float] = {}
        self.epochs_done = 0
        # A resumed run's epochs up to this one are in the MLflow run already: logged by an attempt
        # that was killed (kill -9) after its checkpoint; they are printed, not logged twice.
        self.logged_through = 0

    def on_epoch_end(self, epoch: int, logs: Dict[str, float]) -> None:
        if not logs:  # mode=input has no epoch metrics
            return
        self.last = dict(logs)
        self.epochs_done = epoch + 1
        if epoch + 1 > self.logged_through:
            self.tracker.log_metrics({**logs, **self.epoch_timing(epoch)}, step=epoch + 1)
        shown = "  ".join(f"{key} {value:.4f}" for key, value in logs.items())
        print(f"epoch {epoch + 1}/{self.plan.epochs}  {shown}", flush=True)

    def epoch_timing(self, epoch: int) -> Dict[str, float]:
        """`epoch/...` metrics of this epoch's timed steps (none when all were warm-up)."""
        first, end = epoch * self.plan.steps_per_epoch, (epoch + 1) * self.plan.steps_per_epoch
        kept = [step for step in self.plan.timed(self.timer.num_steps) if first <= step < end]
        if not kept:
            return {}
        epoch_timer = StepTimer([self.timer.input_wait_s[i] for i in kept], [self.timer.compute_s[i] for i in kept])
        plan = StepPlan(1, len(kept), 0, steps_per_execution=self.plan.steps_per_execution)
        figures = timing_figures(epoch_timer, plan, self.examples_per_step, self.bytes_per_step)
        metrics = readable_metrics({key: getattr(figures, key) for key in EPOCH_SERIES})
        return {f"epoch/{key}": value for key, value in metrics.items()}


class Run:
    """What one experiment needs, kept on `self`, and its life: enter, `build`, a mode, exit."""

    def __init__(self, config: Config, output_dir: Path, resolved: dict, overrides: Sequence[str] = ()) -> None:
        self.config = config
        self.output_dir = output_dir
        self.resolved = redact(resolved)  # what bwopt logs and writes carries no secret
        self.overrides = [redact_text(override) for override in overrides]
        self.workload = Workload(config)
        self.timer = StepTimer()
        self.mode_figures: Dict[str, float] = {}
        self.resume_state = None  # bwopt.checkpoint.ResumeState of the stopped run this one continues
        self.run_id: Optional[str] = None
        self.summary: Optional[Summary] = None

    def __enter__(self) -> "Run":
        """Prepare the workload, then start tracking.

        Everything that can reject the config (sizes, a device that is not there, a batch that the
        replicas cannot share) comes before the MLflow run exists, so a mistake leaves no FAILED run.
        """
        from bwopt.measure import reset_peak_host_rss

        self.output_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.tracker = build_tracker(self.config.tracking)
            self.tracker.check()  # a store that cannot work ends the run in a second, before TensorFlow loads
            self.workload.prepare()
            self._find_stopped_run()
            STOP.check()  # a signal during the set-up: no MLflow run is made only to be marked KILLED
            resumed = self.resume_state.run_id if self.resume_state else None
            params = flatten(self.resolved)
            self.run_id = self.tracker.start(params, {"mode": self.config.mode}, self.overrides, resumed)
        except BaseException:
            self.workload.close()
            raise
        batch = self.config.train.global_batch_size
        self.epoch_log = EpochLog(self.tracker, self.timer, self.workload.input_plan, batch)
        if self.resume_state is not None:  # the finished epochs count as if they ran now
            self.timer.input_wait_s = list(self.resume_state.input_wait_s)
            self.timer.compute_s = list(self.resume_state.compute_s)
            cpu_s = list(self.resume_state.cpu_s)  # a state written before CPU time was read has none
            self.timer.cpu_s = (
                cpu_s if len(cpu_s) == len(self.timer.compute_s) else [math.nan] * len(self.timer.compute_s)
            )
            self.epoch_log.last = dict(self.resume_state.epoch_metrics)
            self.epoch_log.epochs_done = self.resume_state.epochs_done
            self.epoch_log.logged_through = self.tracker.last_logged_step("loss")
        reset_peak_host_rss()  # this run's peak, not that of earlier jobs of a multirun
        return self

    def _find_stopped_run(self) -> None:
        """Resume the stopped run in this run folder, or with train.resume the latest one of this command."""
        from bwopt import checkpoint
        from bwopt.schema import ConfigError

        if self.config.mode != "train":
            return
        if self.config.train.resume and checkpoint.load_state(self.output_dir) is None:
            runs_root = self.output_dir.parent.parent  # outputs/runs/<date>/<time>
            found = checkpoint.find_resumable(runs_root, self.overrides)
            if found is None:
                raise ConfigError(
                    f"train.resume=true: no run of this command stopped with a checkpoint under {runs_root}; "
                    "run it without train.resume"
                )
            self.output_dir = found
        self.resume_state = checkpoint.load_state(self.output_dir)
        if self.resume_state is not None:
            self._check_resumable(self.resume_state)
            done = self.resume_state.epochs_done
            self.workload.start_after_epoch(done)
            print(f"bwopt: resuming the run in {self.output_dir} after {done} finished epoch(s)", flush=True)

    def _check_resumable(self, state) -> None:
        """Refuse, before the MLflow run is reopened, to continue a stopped run with another config.

        Raises:
            ConfigError: naming every key whose value differs and may not (bwopt.checkpoint.MAY_CHANGE).
        """
        from bwopt import checkpoint
        from bwopt.schema import ConfigError

        where = self.output_dir / checkpoint.FOLDER
        changed = checkpoint.changed_keys(state.config, flatten(self.resolved)) if state.config else []
        if changed:
            raise ConfigError(
                f"the stopped run in {self.output_dir} cannot resume with another config: {'; '.join(changed)}. "
                f"Run it with the values it stopped with, or start afresh (another hydra.run.dir, or remove {where})"
            )
        if self.config.train.epochs < state.epochs_done:
            raise ConfigError(
                f"train.epochs={self.config.train.epochs}: the stopped run in {self.output_dir} finished "
                f"{state.epochs_done} epoch(s) already; resume it with train.epochs >= {state.epochs_done}"
            )

    def build(self) -> None:
        """The workload's inputs, model and steps, what ran where as tags, and a resumed run's weights."""
        self.tracker.set_tags(self.workload.tags())
        self.workload.build()
        if self.resume_state is not None and self.workload.model is not None:
            from bwopt import checkpoint
            from bwopt.schema import ConfigError

            try:
                checkpoint.restore(self.output_dir, self.workload.model, self.workload.optimizer)
            except (ValueError, AssertionError) as error:  # a state.json older than its config
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ConfigError(
                    f"the checkpoint in {self.output_dir / checkpoint.FOLDER} does not fit this model ({first}); "
                    "resume with the config it stopped with, or start afresh in another hydra.run.dir"
                ) from error

    def loop_hooks(self) -> List[Hook]:
        """The run's hooks on the timed loop: step timer, epoch log, profiler, progress, stop check."""
        from bwopt.profiling import StepProfiler
        from bwopt.progress import ProgressBar

        config, steps = self.config, self.workload.input_plan.steps
        hooks: List[Hook] = [self.timer, self.epoch_log]
        if config.mode == "train" and config.measure.profile_num_steps:
            hooks.append(StepProfiler(str(self.output_dir / "profile"), steps.profiled))
        if config.measure.progress:
            examples_per_loop_step = config.train.global_batch_size * steps.steps_per_execution
            hooks.append(ProgressBar(steps.epochs, steps.steps_per_epoch, examples_per_loop_step))
        if config.mode == "train" and config.train.terminate_on_nan:
            from bwopt.train import TerminateOnNaN

            hooks.append(TerminateOnNaN())
        return [*hooks, StopCheck()]

    # --- the end ----------------------------------------------------------------------------

    def __exit__(self, exc_type, exc, traceback) -> bool:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        STOP.finishing = True  # a second signal now must not cost the records
        if not self.mode_figures:  # a mode stopped part-way hands what it measured with its exception
            self.mode_figures = dict(getattr(exc, "measured", None) or {})
        if exc_type is not None:  # why the run did not finish, on the run's page
            reason = (
                f"stopped by {STOP.requested}"
                if status == "KILLED" and STOP.requested
                else f"{exc_type.__name__}: {exc}"
            )
            self.tracker.set_tags({"bwopt.end_reason": redact_text(reason)[:5000]})
        try:
            self._keep_or_drop_checkpoint(status)
            self.summary = summarise(self, status)
            record(self, self.summary)
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except BaseException as error:  # the records themselves failed (a full disk, a store gone)
            status = "FAILED"
            if exc_type is None:
                self.tracker.set_tags({"bwopt.end_reason": redact_text(f"{type(error).__name__}: {error}")[:5000]})
            raise
        finally:
            self.workload.close()
            self.tracker.end(status)
            if self.summary is not None:
                self.summary.status = status
                from bwopt.terminal import print_summary

                print_summary(self.summary, file=sys.stdout if status == "FINISHED" else sys.stderr)
            self._tell_what_tracking_missed()
            STOP.finishing = False
        return False

    def _tell_what_tracking_missed(self) -> None:
        """The tracking store failed during the run (the run went on): say how to complete its MLflow run."""
        if not self.tracker.failures:
            return
        missed = ", ".join(dict.fromkeys(self.tracker.failures))
        if (self.output_dir / "summary.json").is_file():
            print(
                f"bwopt: MLflow missed part of run {self.run_id} (it could not {missed}); once the store answers "
                f"again, run: python -m bwopt.tracking complete {self.output_dir}",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"bwopt: MLflow missed part of run {self.run_id} (it could not {missed})", file=sys.stderr)

    def _keep_or_drop_checkpoint(self, status: str) -> None:
        """Stopped by a signal while training: write the state to resume from. Finished: none is left."""
        from bwopt import checkpoint

        if status == "FINISHED":
            checkpoint.remove(self.output_dir)
            return
        if status != "KILLED" or self.workload.steps is None or not self.config.train.checkpoint_on_stop:
            return  # not stopped while training, or stopped before the model and its steps were built
        done = self.epoch_log.epochs_done
        steps = done * self.workload.input_plan.steps.steps_per_epoch
        state = checkpoint.ResumeState(
            run_id=self.run_id,
            epochs_done=done,
            input_wait_s=self.timer.input_wait_s[:steps],
            compute_s=self.timer.compute_s[:steps],
            cpu_s=self.timer.cpu_s[:steps],
            epoch_metrics=self.epoch_log.last,
            overrides=self.overrides,
            config=flatten(self.resolved),
        )
        checkpoint.save(self.output_dir, state, self.workload.model, self.workload.optimizer)
        print(
            f"bwopt: checkpoint written to {self.output_dir / checkpoint.FOLDER} after {done} epoch(s)", file=sys.stderr
        )
