"""How much of the host's memory bandwidth the input pipeline moves, for large images, per transfer dtype.

Every run is a real bwopt run in `mode=input` (the distributed training dataset iterated alone,
timed like training steps; bwopt.modes.run_input_only) on synthetic uint8 images of 224x224x3
(data=synthetic, 640 images, 512 of them in the training split), global batch 32,
pipeline=tuned (in-memory cache of the raw uint8 images, shuffle, the cast to the transfer
dtype vectorised after batch, autotuned prefetch), `pipeline.transfer_dtype` in uint8,
bfloat16, float16 and float32, with the memcpy test on (`measure.memcpy_bandwidth=true`: best of
5 copies of 64 MiB in the same process, bwopt.measure.host). The first 16 batches (one pass,
which fills the cache) are warm-up.

The dtypes alternate in rounds (in `_common.alternate`'s order). Printed per dtype: the
input throughput in bytes/s as transferred (features in the transfer dtype plus the int32
label) and examples/s, and the per-round ratio of those bytes/s to the host memcpy bandwidth
of the same run (`_common.spread`: geometric mean, 95 % interval, median, min-max). No
target: the figure says how far a pipeline is from the bus it feeds (a wider dtype moves more
bytes per example; whether it moves them as fast is what the ratio shows).

Run: `.venv/bin/python benchmarks/input_bandwidth.py` (about 60 s on 2 cores);
`BWOPT_BENCHMARK_SMOKE=1` runs one short round (the smoke test).
"""

import tempfile
import time
from pathlib import Path

from _common import SMOKE, alternate, compose, configure_devices, load_line, ratios, run_bwopt, spread

ROUNDS = 1 if SMOKE else 5
DTYPES = ("uint8", "bfloat16", "float16", "float32")
BATCH = 32
STEPS = 24 if SMOKE else 56
WORKLOAD = [
    "mode=input",
    "tracking=none",
    "measure.progress=false",
    "measure.memcpy_bandwidth=true",
    "data=synthetic",
    "data.image_shape=[224,224,3]",
    f"data.num_examples={160 if SMOKE else 640}",
    "pipeline=tuned",
    f"train.global_batch_size={BATCH}",
    "train.epochs=1",
    f"train.steps_per_epoch={STEPS}",
    f"train.warmup_steps={4 if SMOKE else 16}",
]


def main() -> None:
    print(
        f"input_bandwidth: mode=input, synthetic uint8 224x224x3, batch {BATCH}, pipeline=tuned, transfer dtype in "
        f"{', '.join(DTYPES)}; {ROUNDS} alternated rounds; {load_line()}",
        flush=True,
    )
    started_all = time.perf_counter()
    configs = {dtype: compose([*WORKLOAD, f"pipeline.transfer_dtype={dtype}"]) for dtype in DTYPES}
    configure_devices(configs["uint8"][0])
    with tempfile.TemporaryDirectory() as scratch:
        sides = {dtype: (lambda dtype=dtype: run_bwopt(*configs[dtype], Path(scratch) / "run")) for dtype in DTYPES}
        summaries = alternate(sides, ROUNDS)
    print(f"{ROUNDS} rounds, {time.perf_counter() - started_all:.0f} s")
    memcpy = [s.measurements["host_memcpy_bytes_per_s"] for runs in summaries.values() for s in runs]
    print(f"  host memcpy (every run)  GB/s {spread([value / 1e9 for value in memcpy], '.2f')}")
    for dtype, runs in summaries.items():
        bytes_per_s = [s.figures.throughput_bytes_per_s for s in runs]
        examples_per_s = [s.figures.throughput_examples_per_s for s in runs]
        print(
            f"  {dtype:<9} input MB/s {spread([value / 1e6 for value in bytes_per_s], ',.0f')}  "
            f"examples/s {spread(examples_per_s, ',.0f')}"
        )
    for dtype, runs in summaries.items():
        bytes_per_s = [s.figures.throughput_bytes_per_s for s in runs]
        per_round = ratios(bytes_per_s, [s.measurements["host_memcpy_bytes_per_s"] for s in runs])
        print(f"ratio input bytes/s / host memcpy, {dtype:<8}: {spread(per_round, '.4f')}")


if __name__ == "__main__":
    main()
