"""Stopping by signal: real signals sent to this process (the handler runs in the main thread), and a
real process tree for a child that must die with its parent."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO

from bwopt.signals import StopCheck


def deliver(signum: signal.Signals) -> None:
    """Send `signum` to this process and give the interpreter the chance to run its handler."""
    os.kill(os.getpid(), signum)
    for _ in range(100):  # the handler runs between two bytecodes of the main thread
        time.sleep(0.001)


def test_sighup_stops_as_sigterm_does_with_the_shells_code_129(installed):
    with pytest.raises(KeyboardInterrupt, match="stopped by SIGHUP"):
        deliver(signal.SIGHUP)
    assert installed.requested == "SIGHUP" and installed.exit_code == 129


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_stops_at_once_outside_a_loop(installed, signum):
    """Loading data, counting records, building, the ceilings' set-up, inference: no step boundary
    to wait for, so the handler raises at once."""
    with pytest.raises(KeyboardInterrupt):
        deliver(signum)
    assert installed.exit_code == 128 + signum.value


def test_in_a_loop_the_first_signal_stops_at_the_step_boundary_and_a_second_at_once(installed):
    with pytest.raises(KeyboardInterrupt, match="stopped by SIGTERM"):
        with installed.deferred():
            deliver(signal.SIGTERM)  # inside the step: only asked
            assert installed.requested == "SIGTERM"
            StopCheck().on_step_end(0, None)  # the step's end
    installed.reset()
    with pytest.raises(KeyboardInterrupt, match="stopped by SIGINT"):
        with installed.deferred():
            deliver(signal.SIGINT)
            deliver(signal.SIGINT)  # a second one does not wait for the step
    assert installed.num_signals == 2


def test_leaving_a_loop_with_a_stop_asked_in_its_last_step_stops(installed):
    with pytest.raises(KeyboardInterrupt):
        with installed.deferred():
            deliver(signal.SIGTERM)
        pytest.fail("the stop was not raised on leaving the loop")


def test_while_the_run_records_two_signals_are_noted_and_a_third_stops(installed, capfd, monkeypatch):
    class InAPrint:  # the handler runs between two bytecodes of a print to stderr, whose buffer is busy
        def write(self, text):
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

        def flush(self):
            raise RuntimeError("reentrant call")

    installed.finishing = True
    monkeypatch.setattr(sys, "stderr", InAPrint())
    deliver(signal.SIGTERM)
    deliver(signal.SIGTERM)  # noted on file descriptor 2 directly
    monkeypatch.undo()
    assert "keeping what was measured" in capfd.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        deliver(signal.SIGTERM)
    assert installed.requested == "SIGTERM"  # the first signal says why


def test_a_wait_outside_the_process_gives_way_to_the_first_signal_even_in_a_loop(installed):
    with pytest.raises(KeyboardInterrupt), installed.deferred(), installed.interruptible():
        deliver(signal.SIGTERM)


def test_a_shielded_call_finishes_and_then_stops_as_the_place_it_was_called_from_would(installed):
    """Outside a loop the first signal stops once the call is done; in a loop, at the step's end."""
    finished = []
    with pytest.raises(KeyboardInterrupt, match="stopped by SIGTERM"):
        with installed.shielded():
            deliver(signal.SIGTERM)
            finished.append("the call")
    assert finished == ["the call"]
    installed.reset()
    with pytest.raises(KeyboardInterrupt, match="stopped by SIGINT"), installed.deferred():
        with installed.shielded():
            deliver(signal.SIGINT)
        finished.append(installed.requested)  # asked; the loop's StopCheck acts on it
        StopCheck().on_step_end(0, None)
    assert finished == ["the call", "SIGINT"]


def test_in_a_shielded_call_a_second_signal_waits_for_its_end_and_a_third_stops_at_once(installed):
    noted = []
    with pytest.raises(KeyboardInterrupt), installed.deferred():
        with installed.shielded():
            deliver(signal.SIGTERM)
            deliver(signal.SIGTERM)  # in a loop, outside the call, the second stops at once
            noted.append(installed.num_signals)
    assert noted == [2]
    installed.reset()
    with pytest.raises(KeyboardInterrupt), installed.shielded():
        deliver(signal.SIGTERM)
        deliver(signal.SIGTERM)
        noted.append(installed.num_signals)
        deliver(signal.SIGTERM)
        noted.append("not reached: the third stops inside the call")
    assert noted == [2, 2]
    installed.reset()
    with pytest.raises(KeyboardInterrupt, match="stopped by SIGTERM"):  # a stop wins over the call's error
        with installed.shielded():
            deliver(signal.SIGTERM)
            raise RuntimeError("the store failed")


def test_reclaim_takes_sigterm_back_from_a_library_that_took_it(installed):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as TensorFlow's preemption notifier does, in C++
    installed.reclaim()
    with pytest.raises(KeyboardInterrupt):
        deliver(signal.SIGTERM)


@pytest.mark.slow
def test_a_child_dies_with_its_parent_even_when_the_parent_is_killed(tmp_path):
    """PR_SET_PDEATHSIG: no sweep job or cluster task trains on as an orphan."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    parent_code = (
        "import subprocess, sys, time\n"
        "from bwopt.signals import die_with_this_process\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " preexec_fn=die_with_this_process())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait()
    child.wait(timeout=10)  # psutil.TimeoutExpired if it outlived its parent
    assert not child.is_running()


def test_an_ignored_sighup_stays_ignored_for_nohup(installed):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    installed.install()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    deliver(signal.SIGHUP)  # nothing happens
    assert installed.requested is None
