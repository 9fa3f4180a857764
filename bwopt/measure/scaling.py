"""Scaling efficiency: how much of N replicas' worth of throughput a run at N replicas gets."""

import statistics
from typing import Dict, Sequence


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
