"""How long the command line takes to answer when there is no training to do.

Two commands, each in a fresh process as a user types them, from the repository root, with the
same Python interpreter as this script:

- `python -m bwopt --help`: Hydra's help (the config groups and their options);
- `python -m bwopt pipeline.prefetch=-1`: a bad config, rejected by bwopt's schema before
  TensorFlow is imported (the check that the exit status is non-zero and that stderr names the
  key is part of the benchmark).

Each is timed as the wall clock around `subprocess.run` (interpreter start, imports, Hydra's
composition, the answer, exit), alternated with the other for `REPEATS` rounds after one
untimed run each (a cold disk cache is not what is measured). Printed per command: `_common.spread`
(geometric mean, 95 % interval, median, min-max); target < 1.5 s each (on the interval).

Run: `.venv/bin/python benchmarks/cli_latency.py` (about 20 s on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` times each once (the smoke test).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from _common import SMOKE, alternate, load_line, spread, verdict

REPO = Path(__file__).resolve().parents[1]
REPEATS = 1 if SMOKE else 9
TARGET_S = 1.5
COMMANDS = {
    "--help": ["--help"],
    "rejected config": ["pipeline.prefetch=-1"],
}


def timed(arguments, bad: bool):
    def measure() -> float:
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "bwopt", *arguments],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        wall_s = time.perf_counter() - started
        if bad and (result.returncode == 0 or "prefetch" not in result.stderr + result.stdout):
            raise RuntimeError(f"the bad config was not rejected: exit {result.returncode}, {result.stderr[-500:]}")
        if not bad and result.returncode != 0:
            raise RuntimeError(f"--help failed: exit {result.returncode}, {result.stderr[-500:]}")
        return wall_s

    return measure


def main() -> None:
    print(
        f"cli_latency: wall time of `{Path(sys.executable).name} -m bwopt ...` in a fresh process, "
        f"{REPEATS} alternated rounds after one untimed run each; {load_line()}",
        flush=True,
    )
    sides = {name: timed(arguments, bad=name != "--help") for name, arguments in COMMANDS.items()}
    for measure in sides.values():
        measure()
    results = alternate(sides, REPEATS)
    for name, values in results.items():
        note = f"  target < {TARGET_S} s: {verdict(values, TARGET_S, higher_is_better=False)}"
        print(f"wall time python -m bwopt {' '.join(COMMANDS[name])}: {spread(values, '.3f')} s{note}")


if __name__ == "__main__":
    main()
