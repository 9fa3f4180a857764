"""Measurements checked against workloads whose answers are known or measured independently.

The artificial source sleeps a configured time per element, and each train step sleeps a
configured time on top of a tiny model. Python's `time.sleep` overshoots by ~0.1 ms here, and
`tf.data.Dataset.from_generator` adds a few hundred microseconds per element, so the input cost
of one batch is measured independently below (plain perf_counter around the same tf.data
pipeline, none of bwopt's timing code) and the predictions use it. Tolerances: 15 % on times
and throughputs (2 shared cores: another process can steal a few ms from a 20-50 ms step;
observed deviations were under 5 %), 0.08 absolute on fractions.
"""

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import compose_config, known_answer, others_busy_cores

from bwopt.app import validate
from bwopt.data.sources import load_artificial
from bwopt.loop import Hook
from bwopt.measure import StepTimer
from bwopt.measure.verdicts import BOTH_BOUND
from bwopt.pipeline import build_dataset, file_elements

pytestmark = pytest.mark.timing  # every answer here is a time or a rate

BATCH = 16
ELEMENT_S = 0.001
WORKLOAD = [
    "data=artificial",
    "split=uniform",
    "pipeline=naive",
    "pipeline.shuffle_buffer=0",
    "tracking=none",
    "data.num_files=4",
    "data.examples_per_file=128",
    f"train.global_batch_size={BATCH}",
    "train.epochs=1",
    "train.warmup_steps=2",
    "model.hidden_units=[8]",
    "measure.memcpy_bandwidth=false",
]


class InputCost:
    """Seconds one batch of the artificial source costs, timed without bwopt's timer.

    The pipeline is the test's own (the same prefetch). Each call waits a second (a finished run's
    pipelines, still filling their buffers, would compete for the cores), empties its own buffer,
    then times three rounds of 10 batches and gives their median. A test calls it before and after
    its run: the cost it predicts from lies between the two (another process may take a core for
    part of a test, or for all of it). When the rounds of one call disagree by more than 30 %, or a
    batch costs over 3x its sleeps, another process holds the cores and no
    15 % prediction can hold: the test skips and says so.
    """

    def __init__(self, prefetch: int):
        overrides = [*WORKLOAD, f"data.element_latency_s={ELEMENT_S}", f"pipeline.prefetch={prefetch}"]
        config = validate(compose_config(overrides))
        source = load_artificial(config.data, seed=0, validation_fraction=0.25)
        elements = file_elements(config.pipeline, source.train_files, source.open_file)
        self.iterator = iter(build_dataset(config.pipeline, elements, BATCH, training=True, seed=0))
        self.buffered = prefetch
        self.seen = []

    def __call__(self) -> float:
        # A finished run's pipelines may still be filling their buffers: a second lets them, and
        # ours, fill; what ours holds then came for free.
        gc.collect()
        time.sleep(1.0)
        for _ in range(self.buffered + 1):
            next(self.iterator)
        rounds = []
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(10):
                next(self.iterator)
            rounds.append((time.perf_counter() - started) / 10)
        per_batch, analytic = sorted(rounds)[1], BATCH * ELEMENT_S
        assert min(rounds) >= analytic  # the source sleeps at least its configured time
        if max(rounds) > 1.3 * min(rounds) or per_batch > 3 * analytic:
            shown = ", ".join(f"{value * 1e3:.1f}" for value in rounds)
            reason = f"a batch took {shown} ms in three rounds ({analytic * 1e3:.0f} ms of sleep)"
            pytest.skip(f"machine too loaded to calibrate: {reason}")
        self.seen.append(per_batch)
        return per_batch

    def throughputs(self, rel: float = 0.15):
        """(lowest, highest) examples/s the input alone gives at the costs measured, within `rel`."""
        return BATCH / max(self.seen) * (1 - rel), BATCH / min(self.seen) * (1 + rel)


@pytest.fixture(scope="module")
def calibrations():
    return {}


@pytest.fixture
def input_cost(calibrations):
    """prefetch -> the calibration of that pipeline, holding the costs this test measured only."""

    def calibration(prefetch: int = 0) -> InputCost:
        if prefetch not in calibrations:
            calibrations[prefetch] = InputCost(prefetch)
        calibrations[prefetch].seen = []
        return calibrations[prefetch]

    return calibration


def between(value: float, bounds) -> bool:
    low, high = bounds
    return low <= value <= high


def measure(run_experiment, *overrides):
    return run_experiment(*WORKLOAD, *overrides).figures


@pytest.mark.slow  # trains for seconds
def test_without_prefetch_a_step_costs_input_plus_compute(run_experiment, input_cost):
    compute_s = 0.020
    calibration = input_cost()
    calibration()
    figures = measure(run_experiment, f"data.element_latency_s={ELEMENT_S}", f"data.step_compute_s={compute_s}")
    calibration()
    fastest, slowest = min(calibration.seen), max(calibration.seen)
    checks = {
        "step time p50 s": (figures.step_time_p50_s, ((fastest + compute_s) * 0.85, (slowest + compute_s) * 1.15)),
        "examples/s": (
            figures.throughput_examples_per_s,
            (BATCH / (slowest + compute_s) * 0.85, BATCH / (fastest + compute_s) * 1.15),
        ),
        "input wait": (
            figures.input_wait_fraction,
            (fastest / (fastest + compute_s) - 0.08, slowest / (slowest + compute_s) + 0.08),
        ),
    }
    missed = {name: check for name, check in checks.items() if not between(*check)}
    message = "; ".join(
        f"{name} {value:.4g} not in {low:.4g}-{high:.4g}" for name, (value, (low, high)) in missed.items()
    )
    known_answer(not missed, message)
    assert figures.input_bound_verdict == "highly input-bound"


@pytest.mark.slow  # trains for seconds
def test_prefetch_hides_input_behind_longer_compute(run_experiment, input_cost):
    compute_s = max(0.030, 1.5 * input_cost(8)())  # the input hides behind it with room to spare
    figures = measure(
        run_experiment, "pipeline.prefetch=8", f"data.element_latency_s={ELEMENT_S}", f"data.step_compute_s={compute_s}"
    )
    assert figures.step_time_p50_s == pytest.approx(compute_s, rel=0.15)
    expected = BATCH / compute_s  # the mean step, unlike the median, takes every step a busy core delayed
    known_answer(
        abs(figures.throughput_examples_per_s / expected - 1) <= 0.15,
        f"throughput {figures.throughput_examples_per_s:,.0f} examples/s, expected {expected:,.0f} ± 15 %",
    )
    # Without prefetch the wait is ~40 % here; hidden, a few %. The bound leaves room for a loaded
    # machine, where the generator thread that fills the buffer waits for a core (5.1 % was seen).
    assert figures.input_wait_fraction < 0.10
    assert figures.input_bound_verdict != "highly input-bound"


@pytest.mark.slow  # trains for seconds
def test_verdict_flips_between_input_bound_and_compute_bound(run_experiment):
    input_bound = measure(run_experiment, "data.element_latency_s=0.001", "data.step_compute_s=0")
    compute_bound = measure(
        run_experiment, "pipeline.prefetch=8", "data.element_latency_s=0", "data.step_compute_s=0.02"
    )
    assert input_bound.input_wait_fraction > 0.8 and input_bound.verdict == "highly input-bound"
    # Idle a few % of the time unloaded; a loaded machine delays the buffer's refill (9.5 % was seen
    # with both cores busy), still far from the other side of the flip.
    assert compute_bound.input_wait_fraction < 0.15
    # Near the 5 % threshold the interval may straddle it: then the verdict says so rather than guess.
    at_threshold = compute_bound.verdict.startswith("mixed: input stall") and compute_bound.input_stall_fraction < 0.2
    assert compute_bound.verdict in ("compute-bound", "moderately input-bound") or at_threshold


@pytest.mark.slow  # runs its pipeline for seconds
def test_input_mode_measures_the_pipeline_alone(run_experiment, input_cost):
    input_cost = input_cost()
    input_cost()
    summary = run_experiment(*WORKLOAD, "mode=input", f"data.element_latency_s={ELEMENT_S}", "data.step_compute_s=0.05")
    input_cost()
    # No model runs, so the step's compute time never shows; the batch bytes are features + labels.
    assert between(summary.figures.throughput_examples_per_s, input_cost.throughputs())
    assert summary.figures.throughput_bytes_per_s == pytest.approx(
        summary.figures.throughput_examples_per_s * (8 * 4 + 4), rel=1e-9
    )


class WallClock(Hook):
    """Reads the clock when the epoch's first step starts and when its last step has ended: an
    independent measurement of the timed loop."""

    def on_epoch_begin(self, epoch):
        self.started = time.perf_counter()

    def on_step_end(self, step, record):
        self.ended = time.perf_counter()


@pytest.mark.slow  # trains for seconds
def test_reported_throughput_matches_the_loops_wall_clock():
    import keras
    import tensorflow as tf

    from bwopt.data.sources import load_digits
    from bwopt.measure import StepPlan, timing_figures
    from bwopt.pipeline import array_elements
    from bwopt.train import StepSettings, make_step_functions, train

    config = validate(compose_config())
    source = load_digits()
    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.01)
    steps = make_step_functions(strategy, model, optimizer, StepSettings(64, 1 / 16))

    def dataset(training):
        elements = array_elements(source.features, source.labels)
        return build_dataset(config.pipeline, elements, 64, training=training, seed=0)

    timer, clock = StepTimer(), WallClock()
    plan = StepPlan(epochs=1, steps_per_epoch=200, warmup_steps=0)
    metrics = train(steps, iter(dataset(True)), dataset(False), plan, [timer, clock])
    assert set(metrics) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    figures = timing_figures(timer, plan, examples_per_step=64, bytes_per_step=64 * 260)
    wall_s = clock.ended - clock.started
    assert figures.timed_wall_s <= wall_s
    assert figures.throughput_examples_per_s == pytest.approx(200 * 64 / wall_s, rel=0.03)


@pytest.mark.slow  # trains for seconds
@pytest.mark.parametrize("epoch_warmup_steps,biased", [(0, True), (7, False)])
def test_steps_fed_during_validation_are_left_out(run_experiment, input_cost, epoch_warmup_steps, biased):
    """An input-bound run over 3 epochs of 12 batches: validation (3 files, 12 batches, ~0.3 s)
    lets a 6-batch prefetch buffer fill (~0.15 s), so the first 6 steps of epochs 2 and 3 cost
    nothing. Leaving them out gives the steady throughput; counting them inflates it (31 steps
    timed in the time of 19: x1.6)."""
    input_cost = input_cost(6)
    input_cost()
    summary = run_experiment(
        *WORKLOAD,
        "data.num_files=6",
        "data.examples_per_file=64",
        "split.validation_fraction=0.5",
        "pipeline.prefetch=6",
        "train.epochs=3",
        "train.warmup_steps=5",
        f"train.epoch_warmup_steps={epoch_warmup_steps}",
        f"data.element_latency_s={ELEMENT_S}",
        "data.step_compute_s=0",
    )
    input_cost()
    measured = summary.figures.throughput_examples_per_s
    if biased:
        least = 1.25 * BATCH / min(input_cost.seen)
        known_answer(
            measured > least, f"counting the free steps gave {measured:,.0f} examples/s, not over {least:,.0f}"
        )
    else:
        low, high = input_cost.throughputs()
        known_answer(
            low <= measured <= high, f"leaving them out gave {measured:,.0f} examples/s, not {low:,.0f}-{high:,.0f}"
        )


@pytest.mark.slow  # trains for seconds
def test_input_ceiling_is_not_inflated_by_batches_buffered_during_training(run_experiment, input_cost):
    """A deep prefetch buffer is full when training ends; the ceiling drains it before timing."""
    input_cost = input_cost(12)
    compute_s = max(0.030, 1.5 * input_cost())
    summary = run_experiment(
        *WORKLOAD,
        "pipeline.prefetch=12",
        f"data.element_latency_s={ELEMENT_S}",
        f"data.step_compute_s={compute_s}",
        "measure.ceilings=true",
        "measure.ceiling_steps=15",
    )
    input_cost()
    assert between(summary.measurements["input_ceiling_examples_per_s"], input_cost.throughputs())
    # The step sleeps compute_s: the compute ceiling is that, and training ran at the slower of the two.
    assert summary.measurements["compute_ceiling_examples_per_s"] == pytest.approx(BATCH / compute_s, rel=0.15)
    assert summary.measurements["efficiency"] == pytest.approx(1.0, abs=0.15)


# ---- Input stall vs host overhead, and train.steps_per_execution -------------------------------
# Verdicts, not exact fractions: each case sits far from the thresholds (observed here: stall
# 0.99 for the slow pipeline, 0.02 for the fast one; host overhead 0.54 for the tiny step).

# A batch costs ~8 ms of the source's Python (sleeps and from_generator) against a 40 ms step. Some
# stall remains (the source's thread and the step's sleep, a py_function, share the GIL: probably
# why): 1.6-2.3 % of a 20 ms step here and once 4.2 % (2-8 %) in CI, at the 5 % line; 1.0-1.3 % of 40 ms.
FAST_PIPELINE = ["pipeline.prefetch=4", "data.element_latency_s=0.0002", "data.step_compute_s=0.04"]
# Cached after the first pass (24 batches), so the pipeline hands out ready batches; the step is tiny.
# The bundled digits in memory, cached, prefetched deep: batches are always ready, even on a loaded
# machine, and a tiny MLP's step is a fraction of a millisecond, so the host's fixed cost dominates.
TINY_STEP = [
    "tracking=none",
    "pipeline=tuned",
    "pipeline.prefetch=32",
    "model.hidden_units=[8]",
    "train.global_batch_size=16",
    "train.epochs=2",
    "train.steps_per_epoch=88",
    "train.warmup_steps=24",
    "measure.memcpy_bandwidth=false",
]


@pytest.mark.slow  # trains for seconds
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_a_pipeline_much_faster_than_the_step_is_not_input_bound(run_experiment, steps_per_execution):
    figures = measure(run_experiment, *FAST_PIPELINE, f"train.steps_per_execution={steps_per_execution}")
    assert figures.steps_per_execution == steps_per_execution
    met = figures.verdict == "compute-bound" and figures.input_stall_fraction < 0.05
    known_answer(met, f"verdict {figures.verdict!r}, input stall {figures.input_stall_fraction:.1%}")


@pytest.mark.slow  # trains for seconds
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_a_slow_pipeline_is_input_bound_on_the_stall(run_experiment, steps_per_execution):
    figures = measure(
        run_experiment,
        "data.element_latency_s=0.001",
        "data.step_compute_s=0",
        f"train.steps_per_execution={steps_per_execution}",
    )
    assert figures.verdict == "highly input-bound" and figures.input_stall_fraction > 0.8
    # The pipeline sleeps and the step is empty: the run keeps well under one core busy.
    assert figures.cores_busy < 0.5, figures.cores_busy


@pytest.mark.slow  # trains for seconds
def test_a_tiny_step_on_ready_batches_is_host_overhead_bound_and_fusing_steps_cures_it(run_experiment):
    summary = run_experiment(*TINY_STEP)
    figures = summary.figures
    assert figures.host_overhead_fraction >= 0.2 and 0 < figures.fetch_overhead_s < figures.step_time_p50_s
    assert "train.steps_per_execution=8" in summary.recommendation
    # Fused, the host's cost is paid once per 8 steps: faster (observed 1.5-3x here, where the
    # cached pipeline then becomes the limit); on a loaded machine only "faster" is asserted.
    fused = run_experiment(*TINY_STEP, "train.steps_per_execution=8").figures
    ratio = fused.throughput_examples_per_s / figures.throughput_examples_per_s
    known_answer(ratio > 1, f"fused / one step a call: throughput {ratio:.2f}, under 1")
    assert fused.host_overhead_fraction < figures.host_overhead_fraction
    # The verdict names host overhead: its whole interval lies past 20 %. The stall is not this
    # workload's known answer: with both cores busy, making the ready batches takes a core from the
    # loop and the stall sits near 20 % on some machines ("mixed: input stall 16-23 %, host overhead 27-46 %").
    host_low = figures.host_overhead_fraction_ci95[0]
    known_answer(host_low >= 0.2, f"verdict {figures.verdict!r}, host overhead from {host_low:.1%}")
    assert figures.verdict in ("host-overhead-bound", BOTH_BOUND) or figures.verdict.startswith("mixed")


@pytest.mark.slow  # trains for seconds
def test_steps_per_execution_learns_the_same_as_single_steps(run_experiment):
    """Same seed, same batches, same updates: only the float summation order inside the graph's loop
    can differ, so the validation accuracy agrees to within 2 % (7 of the 360 validation images)."""
    common = ["tracking=none", "train.epochs=3", "train.steps_per_epoch=16", "train.warmup_steps=2"]
    single = run_experiment(*common, "measure.memcpy_bandwidth=false")
    fused = run_experiment(*common, "measure.memcpy_bandwidth=false", "train.steps_per_execution=8")
    assert fused.figures.num_timed_steps == 3 * 16 - 3 * 8  # the first execution of each epoch is warm-up
    assert single.final_metrics["val_accuracy"] > 0.8
    assert fused.final_metrics["val_accuracy"] == pytest.approx(single.final_metrics["val_accuracy"], abs=0.02)
    assert fused.final_metrics["loss"] == pytest.approx(single.final_metrics["loss"], rel=0.02)


def test_steps_per_execution_throughput_matches_the_loops_wall_clock():
    import keras
    import tensorflow as tf

    from bwopt.data.sources import load_digits
    from bwopt.measure import StepPlan, timing_figures
    from bwopt.pipeline import array_elements
    from bwopt.train import StepSettings, make_step_functions, train

    config = validate(compose_config())
    source = load_digits()
    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.01)
    steps = make_step_functions(strategy, model, optimizer, StepSettings(64, 1 / 16, steps_per_execution=8))
    dataset = build_dataset(config.pipeline, array_elements(source.features, source.labels), 64, training=True, seed=0)
    timer, clock = StepTimer(), WallClock()
    plan = StepPlan(epochs=1, steps_per_epoch=40, warmup_steps=0, steps_per_execution=8)
    train(steps, iter(strategy.experimental_distribute_dataset(dataset)), (), plan, [timer, clock])
    figures = timing_figures(timer, plan, examples_per_step=64, bytes_per_step=64 * 260)
    assert figures.num_timed_steps == 320
    assert figures.throughput_examples_per_s == pytest.approx(320 * 64 / (clock.ended - clock.started), rel=0.03)


# Both sides CPU-bound on the same cores: 8 augmentation rounds per image and an MLP, all on the CPU.
CORES_BOUND = [
    "experiment=pipelines",
    "pipeline=naive",
    "data.num_examples=8192",
    "train.epochs=2",
    "measure.ceilings=true",
    "measure.ceiling_steps=40",
    "tracking=none",
]


@pytest.mark.slow  # two runs of about 15 s
def test_training_on_the_cores_that_run_its_pipeline_runs_at_its_cores_ceiling(run_experiment):
    """The cores ceiling (cores / the step's and the pipeline's CPU time per example) against what
    is known: a pipeline held to one thread (its own pool of one, each op single-threaded) keeps one
    core busy, one of a thread per core keeps them all busy, a step whose ops split over every
    core holds them all, and training whose two sides both keep
    every core busy runs at the cores ceiling, below the lower of the other two (measured here:
    0.81-0.98 of it on this shrunk preset, 0.93-1.01 on the whole one)."""
    from bwopt.measure.host import available_cores

    cores = available_cores()

    def cores_used(measured, side):  # CPU-seconds per second while that side's ceiling was timed
        return measured[f"{side}_cpu_s_per_example"] * measured[f"{side}_ceiling_examples_per_s"]

    # One map call at a time is not one thread: the map's independent ops run side by side on
    # the inter-op pool (pipeline=naive alone kept 1.23-1.81 cores busy), so the pool is one thread.
    one_thread = ["pipeline.options.private_threadpool_size=1", "pipeline.options.max_intra_op_parallelism=1"]
    serial_run = run_experiment(*CORES_BOUND, *one_thread)
    serial = serial_run.measurements
    # measured 1.03-1.06 idle (the thread and the consumer), 0.65 beside two busy loops on 2 cores
    assert 0.5 <= cores_used(serial, "input") <= 1.3
    # Training measured directly: its process never keeps more cores busy than it has.
    assert 0.3 <= serial_run.figures.cores_busy <= 1.1 * cores
    threads = f"pipeline.map_parallelism={max(1, int(cores))}"
    parallel = run_experiment(*CORES_BOUND, "pipeline.vectorized_map=true", threads)
    figures, measured = parallel.figures, parallel.measurements
    assert cores_used(measured, "input") <= 1.1 * cores  # no process uses more cores than it has
    known_answer(cores_used(measured, "input") >= 0.75 * cores, f"input used {cores_used(measured, 'input'):.2f} cores")
    # The MLP's matrix products split over every intra-op thread: alone, the step kept 1.84-1.86
    # of 2 cores busy, so it holds them all (bwopt.measure.ceilings.step_cores).
    step_busy = cores_used(measured, "compute")
    known_answer(measured["step_cores"] == int(cores), f"the step kept {step_busy:.2f} cores busy alone")
    ratio = figures.throughput_examples_per_s / measured["cores_ceiling_examples_per_s"]
    known_answer(0.7 <= ratio <= 1.2, f"training ran at {ratio:.2f} of the cores ceiling")
    # The estimate's premise, measured on training itself: every core busy, and each example
    # costing about what the step and the pipeline cost apart.
    assert figures.cores_busy <= 1.1 * cores
    known_answer(figures.cores_busy >= 0.75 * cores, f"training kept {figures.cores_busy:.2f} cores busy")
    apart = measured["compute_cpu_s_per_example"] + measured["input_cpu_s_per_example"]
    together = figures.cpu_s_per_example / apart
    known_answer(0.7 <= together <= 1.3, f"training took {together:.2f} of the CPU per example of both sides apart")
    if cores <= 2:  # with more cores the step is too fast for them to be its limit
        below = measured["cores_ceiling_examples_per_s"] < measured["input_ceiling_examples_per_s"]
        known_answer(below, "the cores ceiling was not below the input ceiling")


def test_the_busy_machine_check_counts_another_processs_cpu_time():
    """known_answer's check of other work (conftest.others_busy_cores, from the machine's busy time)
    against the one other process known to run: a spinning child, its CPU time read from its own
    /proc entry over the same window. Holds however busy the machine is: the child's share counts
    in the machine's busy time whatever it gets."""

    def cpu_s(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        wall, before = time.perf_counter(), cpu_s(child.pid)
        others = others_busy_cores(window_s=1.0)
        spun = (cpu_s(child.pid) - before) / (time.perf_counter() - wall)
    finally:
        child.kill()
        child.wait()
    assert spun > 0.2  # the child ran
    assert 0.9 * spun - 0.05 <= others <= len(os.sched_getaffinity(0)) + 0.05, (others, spun)
