"""Keep a run's output to bwopt's own lines; `verbose=True` shows everything the libraries print.

Environment variables alone cannot do it. TensorFlow 2.19+ logs through absl, and absl writes every
message logged before `absl::InitializeLog()` to stderr whatever its level (the line "WARNING: All log
messages before absl::InitializeLog() is called are written to STDERR" says so), so the start-up lines
of the shared libraries' static initialisers ("oneDNN custom operations are on", "Could not find cuda
drivers") ignore TF_CPP_MIN_LOG_LEVEL. Two libraries carry their own copy of that code,
libtensorflow_framework.so.2 and the profiler's _pywrap_profiler_plugin.so, and `import tensorflow`
loads both: each line comes twice, from one process. And on a host without a CUDA driver TensorFlow
logs its CUDA probe as an ERROR ("failed call to cuInit"), which is harmless there: `device=gpu`
without a GPU fails with bwopt's own message.

So `quiet(False)` sets the variables for what does obey them and sends file descriptor 2 through a
small filter process that drops exactly these lines: absl- or TensorFlow-formatted log lines below
TF_CPP_MIN_LOG_LEVEL, absl's pre-initialisation banner and the cuInit probe. Every other line passes,
so an ERROR or FATAL line from C++ and bwopt's own errors still show, in the order they were written;
being a separate process, the filter also forwards what a crashing run wrote last.
"""

import atexit
import logging
import os
import re
import subprocess
import sys

# TensorFlow's C++ severities, in the order TF_CPP_MIN_LOG_LEVEL counts them (0 = INFO ... 3 = FATAL).
SEVERITIES = "IWEF"
# `I0000 00:00:1796003217.445279    3823 port.cc:153] ...` (absl) and
# `2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] ...` (TensorFlow's own).
ABSL_LINE = r"[{severities}]\d{{4}} [\d:.]+ +\d+ \S+:\d+\] "
TENSORFLOW_LINE = r"\d{{4}}-\d\d-\d\d [\d:.]+: [{severities}] \S+:\d+\] "
ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
CUDA_PROBE = "failed call to cuInit"

# Run as `python -c`: copy stdin to stdout line by line, leaving out the lines that match argv[1].
FILTER_PROGRAM = """
import re, sys
noise = re.compile(sys.argv[1].encode())
for line in sys.stdin.buffer:
    if not noise.match(line):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""

_filter = None  # the running filter process, once installed


def quiet(verbose: bool) -> None:
    """Hide the libraries' start-up chatter, or with `verbose` let TensorFlow log everything.

    For the process that runs a job: call before TensorFlow or MLflow is imported. Variables the
    user has set are kept. Idempotent, so every job of an in-process multirun may call it; the first
    call decides.
    """
    quiet_libraries(verbose)
    if not verbose:
        filter_native_stderr(noise_pattern(tf_min_log_level()))


def quiet_libraries(verbose: bool) -> None:
    """The part of `quiet` that leaves file descriptors alone, safe in any process (a sweep's launcher, tests)."""
    if verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")  # bwopt's own default is 2
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # "Creating initial MLflow database tables..."
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # in case MLflow is imported already
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # MirroredStrategy's INFO lines


def tf_min_log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as TensorFlow reads it: 0 (everything) to 3, 0 when unset or not a number."""
    value = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "")
    return min(max(int(value), 0), 3) if value.strip().isdigit() else 0


def noise_pattern(min_log_level: int) -> str:
    """The lines the filter drops: log lines below `min_log_level`, absl's banner, the cuInit probe."""
    below = SEVERITIES[:min_log_level]
    patterns = [re.escape(ABSL_BANNER) + r"\r?$"]
    patterns += [line.format(severities=SEVERITIES) + re.escape(CUDA_PROBE) for line in (ABSL_LINE, TENSORFLOW_LINE)]
    if below:
        patterns += [line.format(severities=below) for line in (ABSL_LINE, TENSORFLOW_LINE)]
    return "|".join(f"(?:{pattern})" for pattern in patterns)


def filter_native_stderr(pattern: str) -> None:
    """Send file descriptor 2 through a filter process dropping lines that match `pattern`.

    The filter writes to the original stderr and ends when the last writer (this process and any
    child that inherited the descriptor) closes the pipe, so it forwards the last lines of a run
    that crashes. It runs in its own session, so Ctrl-C reaches the run, not the filter.
    """
    global _filter
    if _filter is not None or os.name != "posix":
        return
    try:
        original = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        return
    if sys.stderr is not None:
        sys.stderr.flush()
    _filter = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", FILTER_PROGRAM, pattern],
        stdin=subprocess.PIPE,
        stdout=original,
        start_new_session=True,
    )
    os.dup2(_filter.stdin.fileno(), 2)
    _filter.stdin.close()
    atexit.register(_end_filter, original)


def _end_filter(original: int) -> None:
    """At exit: give fd 2 back to the original stderr, so the filter sees the end and flushes."""
    if sys.stderr is not None:
        sys.stderr.flush()
    os.dup2(original, 2)
    os.close(original)
    try:
        _filter.wait(timeout=5)  # a child still holding the pipe keeps it alive; do not wait for it
    except subprocess.TimeoutExpired:
        pass
    except KeyboardInterrupt:  # a stop signal while exiting (a cluster stopping its tasks): the exit goes on
        pass
