"""Run every benchmark in this folder, one after the other, each in its own process.

Every `benchmarks/*.py` script except this one runs with the same Python interpreter as this
script, in a fresh subprocess (TensorFlow fixes its devices once per process), from the
repository root, in name order, with its output passed through as it comes. At the end, one
line per script says whether it passed and how long it took; the exit status is non-zero when
any script failed.

Run: `.venv/bin/python benchmarks/run_all.py` (or `make benchmark`).
"""

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def benchmark_scripts():
    return sorted(
        path
        for path in HERE.glob("*.py")
        if path.resolve() != Path(__file__).resolve() and not path.name.startswith("_")
    )


def main() -> int:
    scripts = benchmark_scripts()
    print(f"run_all: {len(scripts)} benchmark(s) with {sys.executable}, each in its own process", flush=True)
    results = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        started = time.perf_counter()
        returncode = subprocess.run([sys.executable, str(script)], check=False, cwd=REPO).returncode
        results.append((script, returncode, time.perf_counter() - started))
    print("\nrun_all summary:")
    for script, returncode, wall_s in results:
        verdict = "ok" if returncode == 0 else f"FAILED (exit {returncode})"
        print(f"  {script.name:<24} {verdict:<18} {wall_s:6.1f} s")
    failed = [script for script, returncode, _ in results if returncode != 0]
    if failed:
        print(f"run_all: {len(failed)} of {len(results)} benchmark(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
