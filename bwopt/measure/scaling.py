"""Scaling efficiency: how much of N replicas' worth of throughput a run at N replicas gets."""

import json
import statistics
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence


def scaling_efficiency(summaries: Sequence[dict]) -> Dict[int, float]:
    """Scaling efficiency per replica count from job summaries (summary.json contents).

    efficiency(N) = throughput(N) / (N x throughput(1)), where N is a summary's `num_replicas`
    (the processes x devices that ran replicas) and throughput its examples/s; with several
    summaries for one N (repeats) their median is used. Summaries without figures (failed jobs)
    are skipped; {} when no one-replica run succeeded.
    """
    by_replicas: Dict[int, list] = {}
    for summary in summaries:
        figures = summary.get("figures") or {}
        if summary.get("num_replicas") and figures.get("throughput_examples_per_s"):
            by_replicas.setdefault(int(summary["num_replicas"]), []).append(figures["throughput_examples_per_s"])
    if 1 not in by_replicas:
        return {}
    single = statistics.median(by_replicas[1])
    return {n: statistics.median(values) / (n * single) for n, values in sorted(by_replicas.items())}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m bwopt.measure.scaling SWEEP_DIR`: the scaling efficiency of the jobs of a sweep folder."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) != 1 or not Path(arguments[0]).is_dir():
        print(main.__doc__, file=sys.stderr)
        return 2
    summaries = [json.loads(path.read_text()) for path in sorted(Path(arguments[0]).glob("*/summary.json"))]
    for replicas, efficiency in scaling_efficiency(summaries).items():
        print(f"{replicas:>3} replica(s)  scaling efficiency {efficiency:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
