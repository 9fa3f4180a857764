"""Every figure bwopt reports, defined once, each with a docstring saying what is timed and what is not.

- `timing`: the timed loop (throughput, step-time percentiles, jitter, input wait, verdict);
- `ceilings`: the train step alone and the input pipeline alone;
- `overhead`: the per-call costs that split input wait into input stall and host overhead;
- `host`: memcpy bandwidth and peak memory, measured in the run's own process;
- `inference`: forward-pass throughput and latency;
- `advice`: efficiency against the ceilings and the recommendation.

Nothing here imports TensorFlow at module level.
"""

from bwopt.measure.advice import (
    Ceilings,
    PipelineKnobs,
    efficiency,
    efficiency_spread,
    pipeline_knobs_off,
    recommend,
    relative_spread,
)
from bwopt.measure.ceilings import CpuClock, compute_ceiling, cores_ceiling, input_ceiling, read_on_host, wait_for_batch
from bwopt.measure.host import (
    host_memcpy_bandwidth_bytes_per_s,
    peak_device_memory_bytes,
    peak_host_rss_bytes,
    reset_device_memory_peaks,
    reset_peak_host_rss,
)
from bwopt.measure.inference import InferenceFigures, measure_inference
from bwopt.measure.overhead import dispatch_overhead_s, fetch_overhead_s, ready_execution_s
from bwopt.measure.references import HostReferences
from bwopt.measure.timing import MAD_TO_SIGMA, StepPlan, StepTimer, TimingFigures, jitter, timing_figures
from bwopt.measure.verdicts import (
    HIGHLY_INPUT_BOUND,
    HOST_OVERHEAD_BOUND,
    MODERATELY_INPUT_BOUND,
    bottleneck_verdict,
    input_bound_verdict,
)

__all__ = [
    "Ceilings",
    "CpuClock",
    "cores_ceiling",
    "HIGHLY_INPUT_BOUND",
    "HOST_OVERHEAD_BOUND",
    "HostReferences",
    "bottleneck_verdict",
    "dispatch_overhead_s",
    "efficiency_spread",
    "fetch_overhead_s",
    "ready_execution_s",
    "relative_spread",
    "InferenceFigures",
    "MAD_TO_SIGMA",
    "MODERATELY_INPUT_BOUND",
    "StepPlan",
    "StepTimer",
    "TimingFigures",
    "compute_ceiling",
    "efficiency",
    "host_memcpy_bandwidth_bytes_per_s",
    "input_bound_verdict",
    "input_ceiling",
    "jitter",
    "measure_inference",
    "peak_device_memory_bytes",
    "peak_host_rss_bytes",
    "PipelineKnobs",
    "pipeline_knobs_off",
    "read_on_host",
    "recommend",
    "reset_device_memory_peaks",
    "reset_peak_host_rss",
    "timing_figures",
    "wait_for_batch",
]
