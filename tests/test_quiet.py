"""bwopt.quiet: a default run prints bwopt's own lines, none of TensorFlow's or MLflow's start-up chatter."""

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, run_bwopt

from bwopt.quiet import noise_pattern

# TensorFlow's C++ log lines (absl's `I0000 00:00:1796003217.445279 3823 port.cc:153] ...` and its own
# `2025-09-17 14:44:05.157831: I external/...cc:32] ...`), absl's banner, and what they say at start-up.
CXX_LOG_LINE = re.compile(
    r"^[IWEF]\d{4} |^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] |absl::InitializeLog|oneDNN|cuda|cuInit|TF-TRT"
)
# What a train run of bwopt prints: epoch lines, the summary's head and its indented rows.
BWOPT_LINE = re.compile(r"^(epoch \d+/\d+  |bwopt |  [A-Za-z]|\s{4,}\S)")  # \s{4,}: a wrapped table value


@pytest.mark.slow
def test_default_run_prints_only_bwopt_lines(tmp_path):
    result = run_bwopt(
        "train.epochs=1",
        "train.steps_per_epoch=8",
        "train.warmup_steps=2",
        "measure.memcpy_bandwidth=false",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",  # a new store: MLflow would announce its tables
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "bwopt train run finished" in result.stdout
    lines = (result.stdout + result.stderr).splitlines()
    assert [line for line in lines if CXX_LOG_LINE.search(line)] == []
    assert [line for line in lines if not BWOPT_LINE.match(line)] == []


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796003217.445279    3823 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1796003217.446186    3823 cudart_stub.cc:31] Could not find cuda drivers on your machine.",
        "W0000 00:00:1796003498.007997   10475 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be",
        "E0000 00:00:1796003219.443933    3823 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)",
        "2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda drivers",
    ],
)
def test_filter_drops_start_up_lines_below_the_level(line):
    assert re.match(noise_pattern(2), line)


@pytest.mark.parametrize(
    "line",
    [
        "E0000 00:00:1796003219.443933    3823 op_kernel.cc:1857] OP_REQUIRES failed: Data loss: corrupted record",
        "F0000 00:00:1796003219.443933    3823 tensor.cc:1] Check failed: dtype() == expected_dtype",
        "2025-09-17 14:44:05.176998: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:467] Unable to register",
        "bwopt: invalid config: train.epochs=0 must be at least 1",
        "Traceback (most recent call last):",
    ],
)
def test_filter_keeps_errors_and_python_lines(line):
    assert not re.match(noise_pattern(2), line)


def test_filter_follows_tf_cpp_min_log_level():
    info = "I0000 00:00:1796003217.445279    3823 port.cc:153] oneDNN custom operations are on."
    warning = "W0000 00:00:1796003498.007997   10475 dataset.cc:997] will not be optimized"
    assert not re.match(noise_pattern(0), info)
    assert re.match(noise_pattern(1), info) and not re.match(noise_pattern(1), warning)


# A process that filters its stderr, handles the stop signals, leaves a child holding the filter's
# pipe (so the exit waits on the filter) and says when it is exiting.
EXITING_WITH_A_CHILD = """
import atexit, pathlib, subprocess, sys
from bwopt import quiet
from bwopt.signals import STOP
STOP.install()
quiet.filter_native_stderr(quiet.noise_pattern(2))
child = subprocess.Popen(["sleep", "60"])
atexit.register(pathlib.Path(sys.argv[1]).write_text, f"{child.pid} {quiet._filter.pid}")  # runs first: last registered
"""


def test_a_stop_signal_while_the_process_exits_ends_it_without_a_traceback(tmp_path):
    exiting, stderr = tmp_path / "exiting", tmp_path / "stderr"
    with stderr.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", EXITING_WITH_A_CHILD, str(exiting)],
            stderr=sink,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    deadline = time.monotonic() + 30
    while len(pids := exiting.read_text().split() if exiting.exists() else []) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the file may exist before its text is written
    child, filter_ = (psutil.Process(int(pid)) for pid in pids)
    time.sleep(0.3)  # in the exit's wait on the filter, which the child keeps open
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0  # the exit it was making, not one the signal started
    assert time.monotonic() - started < 4  # not the filter's 5 s of grace
    child.kill()  # the filter sees the end of its pipe, writes what is left and ends
    psutil.wait_procs([filter_], timeout=10)
    assert "Traceback" not in stderr.read_text()
