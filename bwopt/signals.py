"""Stopping a run by signal: SIGINT, SIGTERM or SIGHUP ends it within a second or two, as KILLED.

SIGHUP (the terminal or the SSH session closed) is handled as SIGTERM is; the exit code is the
shell's for death by the signal: 130 SIGINT, 143 SIGTERM, 129 SIGHUP.
"""

import contextlib
import functools
import os
import signal
from typing import Optional

from bwopt.loop import Hook, StepRecord

# The signals that stop a run, a sweep or a cluster in order.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class GracefulStop:
    """The first signal stops whatever the process is doing, at once or at the next step boundary.

    At once (the handler raises KeyboardInterrupt) in every phase but one: loading and counting
    data, building, the ceilings' set-up, inference, a wait on the tracking store
    (`interruptible`). The exception: a loop over TensorFlow iterators (`deferred`: training,
    mode=input, the ceilings' blocks, a sweep's or a cluster's supervision). Raising from the
    handler there would interrupt TensorFlow inside an iterator's `get_next`, which can corrupt
    its heap; so the first signal only asks the loop to stop, and the loop checks `check()`
    between steps (`StopCheck`); a second signal stops at once. While the run records what it
    measured (`finishing`), a first and a second signal are noted, not raised, so the figures
    are kept; a third one stops at once. A write that must not be cut in half (`shielded`: a
    local tracking store's transaction) notes the first two signals too, and acts on them as
    they would have been acted on once it is done.
    """

    def __init__(self) -> None:
        self.requested: Optional[str] = None
        self.finishing = False
        self.num_signals = 0
        self.waiting_outside = False
        self.deferring = False
        self.shielding = False
        self.installed = False

    def reset(self) -> None:
        """Forget a stop (a process that runs more than one thing: tests)."""
        installed = self.installed
        self.__init__()
        self.installed = installed

    @contextlib.contextmanager
    def interruptible(self):
        """A wait on another process or machine, during which the first signal raises at once."""
        before, self.waiting_outside = self.waiting_outside, True
        try:
            yield
        finally:
            self.waiting_outside = before

    @contextlib.contextmanager
    def deferred(self):
        """A loop that calls `check()` between its steps: in it, the first signal only asks it to stop."""
        before, self.deferring = self.deferring, True
        try:
            yield
        finally:
            self.deferring = before
        if not before:  # leaving for a phase the first signal stops at once: a stop asked in the loop's last step
            self.check()

    @contextlib.contextmanager
    def shielded(self):
        """A short, bounded call that a KeyboardInterrupt must not cut in half: the first two signals
        in it are noted, and once it is done, stop as they would have where it was called (at once,
        or at the loop's next step boundary). A third one stops at once."""
        before, self.shielding = self.shielding, True
        signals_before = self.num_signals
        try:
            yield
        finally:  # a stop wins over an error of the call
            self.shielding = before
            if self.num_signals > signals_before and self._stops_at_once():
                raise KeyboardInterrupt(f"stopped by {self.requested}")

    def install(self) -> None:
        """Handle the stop signals; an ignored SIGHUP stays ignored (`nohup`: the run outlives its terminal)."""
        for signum in STOP_SIGNALS:
            if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                continue
            signal.signal(signum, self._handle)
        self.installed = True

    def reclaim(self) -> None:
        """Handle the stop signals again after a library took one (TensorFlow's preemption notifier
        takes SIGTERM); nothing when this process never installed them (a test)."""
        if self.installed:
            self.install()

    def _handle(self, signum, frame) -> None:
        self.num_signals += 1
        self.requested = self.requested or signal.Signals(signum).name  # the first one says why
        if self.finishing and self.num_signals == 2:
            # os.write, not print: the handler may interrupt a print to stderr, whose buffer
            # refuses a reentrant write (RuntimeError)
            os.write(2, b"bwopt: keeping what was measured; a third signal stops at once\n")
        if self._stops_at_once():
            raise KeyboardInterrupt(f"stopped by {self.requested}")

    def _stops_at_once(self) -> bool:
        """Whether the signals received so far stop the process where it is now, or are only noted."""
        if self.finishing or self.shielding:
            return self.num_signals >= 3
        return not (self.num_signals == 1 and self.deferring and not self.waiting_outside)

    @property
    def exit_code(self) -> int:
        """The shell's code for death by the signal that stopped the run: 130 SIGINT, 143 SIGTERM, 129 SIGHUP."""
        return 128 + signal.Signals[self.requested or "SIGINT"].value

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"stopped by {self.requested}")


STOP = GracefulStop()


class StopCheck(Hook):
    """Raise KeyboardInterrupt at the end of the step during which a stop was asked for."""

    follows_extra_steps = True

    def on_step_end(self, step: int, record: StepRecord) -> None:
        STOP.check()


def die_with_this_process(signum: signal.Signals = signal.SIGKILL):
    """For `subprocess.Popen(preexec_fn=...)`: the child, before exec, asks the kernel to send it
    `signum` when this process dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG); a child whose
    parent died before it could ask ends at once. SIGTERM lets a bwopt run end its MLflow run
    KILLED with what it measured, as any SIGTERM does."""
    parent = os.getpid()
    return functools.partial(_die_with, parent, int(signum))


def _die_with(parent: int, signum: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # adopted already: the parent died before the request
        os._exit(1)
