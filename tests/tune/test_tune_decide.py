"""tune's decisions against the analytic optimum, on stages whose costs are known.

The stages are built from the `artificial` source's configured latencies (conf/data/artificial.yaml:
every element of a file sleeps `element_latency_s`, every step `step_compute_s`), so the right
answer is arithmetic: a reader delivers a batch every batch x latency seconds, so keeping up with
a step of `step_compute_s` needs ceil(batch x latency / step) files read at once; a CPU stage of T
seconds per batch on C cores shared with the step runs at most C / (sum T + step) batches/s;
Little's law gives the batches in flight that hide a latency L from a consumer served every P
seconds. Pure functions: no TensorFlow, no process.
"""

import itertools
import math
import random
from dataclasses import replace

import pytest
from conftest import compose_config

from bwopt.app import validate
from bwopt.sweep.tune_decide import (
    BATCH,
    MAP,
    SHUFFLE,
    SOURCE,
    Budget,
    Profile,
    Stage,
    UnsafeProposal,
    batch_scale_for,
    cache_position,
    check_cache_position,
    prefetch_depth,
    scaled_learning_rate,
    sixteen_bit_precision,
    steps_per_execution,
    water_fill,
)
from bwopt.sweep.tune_plan import plan

MIB = 2**20
# Overrides tune may propose: each keeps the examples and the math (tests/test_same_examples.py).
SAME_EXAMPLES_KEYS = {
    "pipeline.map_parallelism",
    "pipeline.prefetch",
    "pipeline.cache",
    "pipeline.vectorized_map",
    "pipeline.transfer_dtype",
    "pipeline.interleave.cycle_length",
    "pipeline.interleave.num_parallel_calls",
    "train.steps_per_execution",
    "pipeline.distribute.fetch_to_device",
    "pipeline.options.map_and_batch_fusion",
}


@pytest.fixture(scope="module")
def artificial():
    """The artificial source with known latencies: 2 ms an element, 8 ms a step, 6 files, batch 32."""
    return validate(
        compose_config(
            [
                "data=artificial",
                "split=uniform",
                "data.num_files=6",
                "data.element_latency_s=0.002",
                "data.step_compute_s=0.008",
                "train.global_batch_size=32",
            ]
        )
    )


def artificial_profile(config, **changes) -> Profile:
    """The artificial pipeline's stages as the probe reports them: a reader that waits, a cast, shuffle, batch."""
    data, batch = config.data, config.train.global_batch_size
    feature_bytes = 4 * math.prod(data.feature_shape)
    num_train_files = data.num_files - max(1, round(config.split.validation_fraction * data.num_files))
    stages = (
        Stage("source (files)", SOURCE, batch * data.element_latency_s, True, False, feature_bytes, io_bound=True),
        Stage("map (cast)", MAP, 0.002, True, False, feature_bytes),
        Stage("shuffle, repeat", SHUFFLE, 0.0005, False, True, feature_bytes),
        Stage("batch", BATCH, 0.0005, False, True, feature_bytes),
    )
    settings = dict(
        stages=stages,
        batch_size=batch,
        examples_per_epoch=num_train_files * data.examples_per_file,
        step_time_s=data.step_compute_s,
        feature_bytes_per_example=feature_bytes + 4,
        num_files=num_train_files,
        steps_per_epoch=num_train_files * data.examples_per_file // batch,
        epochs=config.train.epochs,
    )
    return Profile(**{**settings, **changes})


def test_interleave_width_keeps_the_reader_up_with_the_step(artificial):
    profile = artificial_profile(artificial, epochs=1)  # one epoch: a cache would save nothing
    data, batch = artificial.data, artificial.train.global_batch_size
    proposals = {proposal.name: proposal for proposal in plan(profile, Budget(2, 1e9), {})}
    # 32 elements x 2 ms = 64 ms a batch per reader; a step every 8 ms: 8 readers, but only the 5 training files
    analytic = min(math.ceil(batch * data.element_latency_s / data.step_compute_s), profile.num_files)
    assert profile.num_files == 5 and analytic == 5
    overrides = proposals["parallelize"].overrides
    assert overrides["pipeline.interleave.cycle_length"] == str(analytic)
    assert overrides["pipeline.interleave.num_parallel_calls"] == str(analytic)
    assert "64.0 ms per batch" in proposals["parallelize"].reason


def test_interleave_width_below_the_files_when_fewer_readers_keep_up(artificial):
    profile = artificial_profile(artificial, num_files=40, epochs=1)
    width = plan(profile, Budget(2, 1e9), {})[0].overrides["pipeline.interleave.cycle_length"]
    assert width == "8"  # ceil(64 ms / 8 ms): the step is then the bottleneck


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("costs", [(1.075,), (0.3, 0.1), (0.5, 0.2, 0.05), (0.01, 0.4)])
def test_water_filling_reaches_the_minimax_optimum(costs, cores):
    """max(T_i / p_i) under sum(p_i) <= cores (the stages' threads): water-filling hits the brute-force optimum."""
    stages = [Stage(f"map {index}", MAP, cost, parallel=True) for index, cost in enumerate(costs)]
    threads = water_fill(stages, 0.0, cores)
    achieved = max(stage.cost_per_batch_s / threads[stage.name] for stage in stages)
    best = min(
        max(cost / count for cost, count in zip(costs, allocation))
        for allocation in itertools.product(range(1, cores + 1), repeat=len(costs))
        if sum(allocation) <= max(cores, len(costs))
    )
    # the CPU bound (sum T / cores) can sit below the best integer split; never above it
    assert achieved <= best + 1e-12
    assert achieved >= max(sum(costs) / cores, best) - 1e-12 or sum(threads.values()) > cores


def test_the_issues_example_gives_parallelism_two():
    """'map: 2.1 ms/element x 512 per batch -> 1,075 ms per batch on one core; 2 cores -> parallelism 2'."""
    stage = Stage("map (augment)", MAP, 0.0021 * 512, parallel=True, random=True)
    assert water_fill([stage], 0.0, 2) == {"map (augment)": 2}


def test_a_sequential_stage_caps_the_water_level():
    stages = [Stage("map", MAP, 0.010, parallel=True), Stage("shuffle", SHUFFLE, 0.020)]
    # shuffle delivers a batch every 20 ms whatever the threads: the map needs only one of 8 cores
    assert water_fill(stages, 0.0, 8) == {"map": 1, "shuffle": 1}


def test_cache_goes_after_the_last_deterministic_stage_that_fits():
    stages = [
        Stage("source", SOURCE, 0.01, output_bytes_per_example=100),
        Stage("decode", MAP, 0.05, True, output_bytes_per_example=10_000),
        Stage("shuffle", SHUFFLE, 0.001, random=True, output_bytes_per_example=10_000),
        Stage("augment", MAP, 0.05, True, random=True, output_bytes_per_example=10_000),
    ]
    assert cache_position(stages, 1000, 100 * MIB) == 1  # decoded: 10 MB fit
    assert cache_position(stages, 1000, 1 * MIB) == 0  # only the encoded bytes fit
    assert cache_position(stages, 1000, 1000) is None  # nothing fits


def test_caching_after_a_random_stage_is_refused():
    stages = [
        Stage("source", SOURCE, 0.01),
        Stage("augment", MAP, 0.05, True, random=True),
        Stage("cast", MAP, 0.01, True),
    ]
    check_cache_position(stages, 0)
    with pytest.raises(UnsafeProposal, match="random stage augment"):
        check_cache_position(stages, 2)  # the cast is deterministic, but it follows the augmentation


def test_no_plan_ever_caches_after_a_random_stage():
    """Random pipelines, random costs: every cache tune proposes passes the check, before the first random stage."""
    generator = random.Random(0)
    for _ in range(300):
        kinds = [MAP, MAP, SHUFFLE, MAP, BATCH]
        stages, seen_random = [Stage("source", SOURCE, generator.uniform(0, 0.02), output_bytes_per_example=64)], False
        for index, kind in enumerate(generator.sample(kinds, k=generator.randint(2, 5))):
            seen_random |= kind == SHUFFLE or generator.random() < 0.3
            cost = generator.uniform(0.001, 0.2)
            stages.append(Stage(f"{kind} {index}", kind, cost, kind == MAP, seen_random, 64))
        fused_cost = generator.choice([None, generator.uniform(0.001, 0.2)])  # probed where a map feeds the batch
        profile = Profile(tuple(stages), 64, 1000, generator.uniform(0.001, 0.05), epochs=3)
        profile = replace(profile, fused_map_batch_cost_s=fused_cost)
        position = cache_position(profile.stages, profile.examples_per_epoch, 1e9)
        check_cache_position(profile.stages, position)
        for proposal in plan(profile, Budget(generator.randint(1, 8), 1e9), {}):
            assert set(proposal.overrides) <= SAME_EXAMPLES_KEYS
            if "pipeline.cache" in proposal.overrides:
                first_random = next(
                    index for index, stage in enumerate(stages) if stage.random or stage.kind == SHUFFLE
                )
                assert position is not None and position < first_random


def test_prefetch_depth_is_littles_law_plus_one(artificial):
    """A reader's 64 ms batch latency over 5 files (12.8 ms a batch), consumed every 12.8 ms: 5 + 1 in flight."""
    assert prefetch_depth(0.064, 0.0128, 1 * MIB, 1e9) == 6
    assert prefetch_depth(0.005, 0.010, 1 * MIB, 1e9) == 2  # a fast producer: one ahead, one for jitter
    assert prefetch_depth(0.064, 0.0128, 100 * MIB, 1000 * MIB) == 1  # only one batch fits in 10 % of the memory


def test_cache_first_when_epochs_repeat_the_slow_reader(artificial):
    """Ten epochs of a reader that sleeps: caching after the cast removes it from nine of them."""
    proposals = plan(artificial_profile(artificial), Budget(2, 1e9), {})
    assert proposals[0].overrides == {"pipeline.cache": "memory"}
    assert "stages up to map (cast) are deterministic" in proposals[0].reason
    assert all(
        "pipeline.cache" not in proposal.overrides
        for proposal in plan(artificial_profile(artificial), Budget(2, 1e3), {})
    )


def test_plan_orders_by_gain_and_sets_prefetch_from_the_model(artificial):
    profile = artificial_profile(artificial, epochs=1)
    proposals = plan(profile, Budget(2, 1e9), {})
    assert proposals[0].name == "parallelize"  # the reader is the bottleneck by far
    prefetch = next(proposal for proposal in proposals if proposal.name == "prefetch")
    # after the reader's 5 files: 64 / 5 = 12.8 ms a batch through the reader, + the cast and batch
    latency = 0.064 / 5 + 0.002 / 1 + 0.0005 + 0.0005
    period = max(0.064 / 5, artificial.data.step_compute_s)
    assert prefetch.overrides["pipeline.prefetch"] == str(math.ceil(latency / period) + 1)
    times = [proposal.predicted_batch_time_s for proposal in proposals]
    assert times == sorted(times, reverse=True)  # each on top of the last: the model's time only falls


def test_after_a_revert_the_rest_are_weighed_on_what_was_kept(artificial):
    """The reader read 5 files at once in the first plan's model; reverted, it reads one again."""
    profile, budget = artificial_profile(artificial, epochs=1), Budget(2, 1e9)
    first = plan(profile, budget, {})
    assert plan(profile, budget, {}, kept=[first[0].name]) == first  # kept: the same plan replayed
    prefetch = next(proposal for proposal in first if proposal.name == "prefetch")
    assert "a batch takes 15.8 ms through the stages" in prefetch.reason  # 64 / 5 + 2 + 0.5 + 0.5
    again = plan(profile, budget, {}, rejected=["parallelize"])
    assert [proposal.name for proposal in again] == [p.name for p in first if p.name != "parallelize"]
    prefetch = next(proposal for proposal in again if proposal.name == "prefetch")
    assert "a batch takes 67.0 ms through the stages" in prefetch.reason  # 64 + 2 + 0.5 + 0.5
    assert again[-1].predicted_batch_time_s > first[-1].predicted_batch_time_s
    with pytest.raises(ValueError, match="unknown proposal"):
        plan(profile, budget, {}, rejected=["parallelise"])


def test_steps_per_execution_only_when_host_overhead_dominates():
    assert steps_per_execution(0.05, 100) == 1
    assert steps_per_execution(0.5, 128) == 32  # 0.5 / 0.5 / 0.05 = 20 -> the next power of two
    assert steps_per_execution(0.5, 24) == 8  # it must divide the epoch's 24 steps


def test_vectorising_is_proposed_only_when_it_is_cheaper():
    stages = (
        Stage("source", SOURCE, 0.002, output_bytes_per_example=3076),
        Stage("map (cast)", MAP, 0.006, True, False, 12292),
        Stage("shuffle, repeat", SHUFFLE, 0.0015, False, True, 12292),
        Stage("map (augment)", MAP, 0.110, True, True, 12292),
        Stage("batch", BATCH, 0.003, False, True, 12292),
    )
    cheaper = Profile(stages, 512, 13107, 0.0096, vectorized_map_cost_s=0.060, integer_features=True, epochs=3)
    dearer = Profile(stages, 512, 13107, 0.0096, vectorized_map_cost_s=0.200, integer_features=True, epochs=3)
    assert plan(cheaper, Budget(2, 4e9), {})[0].overrides == {"pipeline.vectorized_map": "true"}
    assert all("pipeline.vectorized_map" not in proposal.overrides for proposal in plan(dearer, Budget(2, 4e9), {}))


@pytest.mark.parametrize(
    "device, flags, capability, policy",
    [
        ("cpu", ["avx2", "amx_bf16", "amx_tile"], None, "mixed_bfloat16"),
        ("cpu", ["avx512f", "avx512_bf16"], None, "mixed_bfloat16"),
        ("cpu", ["avx2", "avx512f"], None, None),
        ("gpu", [], (8, 0), "mixed_bfloat16"),
        ("gpu", [], (7, 5), "mixed_float16"),
        ("gpu", [], (6, 1), None),
        ("gpu", [], None, None),
        ("tpu", [], None, "mixed_bfloat16"),
    ],
)
def test_the_16_bit_policy_is_the_one_the_device_has_units_for(device, flags, capability, policy):
    chosen, reason = sixteen_bit_precision(device, flags, capability)
    assert chosen == policy
    assert reason
    if device == "cpu" and policy is None:
        assert "amx_bf16" in reason and "emulated" in reason


def test_precision_is_proposed_only_when_allowed_after_every_change_that_keeps_the_math():
    stages = (
        Stage("source", SOURCE, 0.002, output_bytes_per_example=3076),
        Stage("shuffle, repeat", SHUFFLE, 0.0015, False, True, 12292),
        Stage("map (augment)", MAP, 0.020, True, True, 12292),
        Stage("batch", BATCH, 0.003, False, True, 12292),
    )
    # a step of 60 ms a batch, far above the pipeline: only the step can go faster
    profile = Profile(stages, 32, 1024, 0.060, sixteen_bit="mixed_bfloat16", sixteen_bit_reason="bf16 units", epochs=3)
    budget = Budget(2, 4e9)
    assert all("device.precision" not in proposal.overrides for proposal in plan(profile, budget, {}))
    allowed = plan(profile, budget, {}, allow=["precision"])
    assert allowed[-1].overrides == {"device.precision": "mixed_bfloat16"}
    assert [proposal.name for proposal in allowed[:-1]] == [proposal.name for proposal in plan(profile, budget, {})]
    assert "changes the math" in allowed[-1].reason and "60.0 ms" in allowed[-1].reason
    # already 16-bit, no units for it, or tried and reverted: nothing
    assert plan(profile, budget, {"precision": "mixed_bfloat16"}, allow=["precision"]) == plan(profile, budget, {})
    no_units = Profile(stages, 32, 1024, 0.060, sixteen_bit=None, epochs=3)
    assert all("device.precision" not in p.overrides for p in plan(no_units, budget, {}, allow=["precision"]))
    reverted = plan(profile, budget, {}, rejected=["lower precision"], allow=["precision"])
    assert all("device.precision" not in proposal.overrides for proposal in reverted)
    # kept, it is applied first when the plan is made again, and the rest weighed on its faster step
    again = plan(profile, budget, {}, kept=["lower precision"], allow=["precision"])
    assert again[0].overrides == {"device.precision": "mixed_bfloat16"}


# A step of 10 ms a batch of 32, half of it the host's fixed cost; a pipeline far below it.
STEP_BOUND = (
    Stage("source", SOURCE, 0.0005, output_bytes_per_example=3076),
    Stage("shuffle, repeat", SHUFFLE, 0.0002, False, True, 3076),
    Stage("batch", BATCH, 0.0002, False, True, 3076),
)


def step_bound(**changes) -> Profile:
    settings = dict(
        stages=STEP_BOUND,
        batch_size=32,
        examples_per_epoch=2048,
        step_time_s=0.010,
        feature_bytes_per_example=3076,
        host_overhead_share=0.5,
        steps_per_epoch=64,
        epochs=2,
        optimizer="adam",
        learning_rate=0.001,
        warmup_steps=5,
    )
    return Profile(**{**settings, **changes})


def batch_proposals(proposals):
    return [proposal for proposal in proposals if "train.global_batch_size" in proposal.overrides]


def test_the_learning_rate_follows_the_batch_by_its_optimizers_rule():
    assert scaled_learning_rate(0.1, "sgd", 4) == (pytest.approx(0.4), "linear")
    assert scaled_learning_rate(0.001, "adam", 4) == (pytest.approx(0.002), "square-root")
    assert scaled_learning_rate(0.001, "rmsprop", 2) == (pytest.approx(0.001 * math.sqrt(2)), "square-root")
    # the host's share below the verdict's threshold: no larger batch; above it, up to 4x
    assert [batch_scale_for(share) for share in (0.1, 0.2, 0.5, 0.9)] == [1, 4, 4, 4]


def test_a_larger_batch_is_proposed_only_when_allowed_where_the_host_cost_is_left():
    profile, budget = step_bound(), Budget(2, 4e9)
    # steps_per_execution, lossless, pays the host's cost first: no larger batch is proposed after it
    assert not batch_proposals(plan(profile, budget, {}, allow=["batch_size"]))
    # tried and reverted (or the start already at one step per call): the batch is what is left
    assert not batch_proposals(plan(profile, budget, {}, rejected=["amortise host"]))
    allowed = plan(profile, budget, {}, rejected=["amortise host"], allow=["batch_size"])
    assert allowed[-1].overrides == {"train.global_batch_size": "128", "train.learning_rate": "0.002"}
    assert "50% of the step" in allowed[-1].reason and "the square-root rule" in allowed[-1].reason
    # 10 ms = 5 ms host + 5 ms compute a batch of 32; 4 batches in one step: 5 + 20 ms, 6.25 ms per 32
    assert allowed[-1].predicted_batch_time_s == pytest.approx(0.00625)
    sgd = plan(step_bound(optimizer="sgd"), budget, {}, rejected=["amortise host"], allow=["batch_size"])
    assert sgd[-1].overrides["train.learning_rate"] == "0.004"
    # where the start sets the epoch's steps, an epoch of the larger batch runs a quarter of them
    fixed = step_bound(steps_per_epoch=48, steps_per_epoch_set=True)
    assert plan(fixed, budget, {}, rejected=["amortise host"], allow=["batch_size"])[-1].overrides == {
        "train.global_batch_size": "128",
        "train.learning_rate": "0.002",
        "train.steps_per_epoch": "12",
    }
    # parameter_server runs one step per closure: the larger batch is what amortises the host there
    ps = plan(step_bound(strategy="parameter_server"), budget, {"prefetch": 2}, allow=["batch_size"])
    assert [proposal.name for proposal in ps] == ["enlarge batch"]
    # a step of fixed cost only: nothing a larger batch could amortise
    assert not batch_proposals(plan(step_bound(host_overhead_share=0.05), budget, {}, allow=["batch_size"]))


@pytest.mark.parametrize(
    "changes, start, expected",
    [
        ({"steps_per_epoch": 24}, {}, "128"),  # 6 steps of 128: one past the 5 warm-up steps
        ({"steps_per_epoch": 12}, {}, "64"),  # 3 steps of 128 would all be warm-up; 6 of 64 would not
        ({"steps_per_epoch": 8}, {}, None),  # 2 or 4 steps: none past the warm-up
        ({"steps_per_epoch": 64, "steps_per_epoch_set": True}, {"steps_per_execution": 4}, "128"),
        ({"steps_per_epoch": 40, "steps_per_epoch_set": True}, {"steps_per_execution": 4}, "64"),  # 10 not 4s
        ({"steps_per_epoch": 20, "steps_per_epoch_set": True}, {"steps_per_execution": 4}, None),  # 5, 10
    ],
)
def test_a_larger_batch_keeps_timed_steps_and_whole_executions(changes, start, expected):
    profile = step_bound(**changes)
    proposals = batch_proposals(plan(profile, Budget(2, 4e9), start, rejected=["amortise host"], allow=["batch_size"]))
    assert [proposal.overrides["train.global_batch_size"] for proposal in proposals] == ([expected] if expected else [])


def test_a_larger_batchs_overrides_are_a_valid_config():
    profile = step_bound(steps_per_epoch=64, steps_per_epoch_set=True)
    (proposal,) = batch_proposals(
        plan(profile, Budget(2, 4e9), {"steps_per_execution": 4}, rejected=["amortise host"], allow=["batch_size"])
    )
    overrides = [f"{key}={value}" for key, value in proposal.overrides.items()]
    start = ["strategy=mirrored", "device.num_cpu_devices=2", "train.steps_per_epoch=64", "train.steps_per_execution=4"]
    config = validate(compose_config([*start, *overrides]))
    assert (config.train.global_batch_size, config.train.steps_per_epoch) == (128, 16)


def test_batches_in_host_memory_are_fetched_to_the_accelerator_only_there():
    # a GPU step of 10 ms on batches already there, and 4 ms more to copy each batch in the step
    gpu = step_bound(device="gpu", device_copy_s=0.004, host_overhead_share=0.0)
    budget = Budget(2, 4e9)
    (proposal,) = plan(gpu, budget, {"fetch_to_device": False, "prefetch": 2})
    assert proposal.overrides == {"pipeline.distribute.fetch_to_device": "true"}
    assert "0.1 MiB arrive in host memory" in proposal.reason and "4.0 ms" in proposal.reason
    assert proposal.predicted_batch_time_s == pytest.approx(0.010)  # the copy overlaps the next step
    # already fetched; a CPU target, where there is no copy; a GPU whose copy was not measured
    cpu, unmeasured = step_bound(host_overhead_share=0.0), replace(gpu, device_copy_s=0.0)
    for profile, fetched in ((gpu, True), (cpu, False), (unmeasured, False)):
        assert plan(profile, budget, {"fetch_to_device": fetched, "prefetch": 2}) == []


def test_a_step_that_holds_every_core_leaves_overlap_only_the_pipelines_share_of_them():
    """experiment=imagenet_like pipeline=naive on 2 cores, measured: the step alone 103 ms a batch
    holding both cores (bwopt.measure.ceilings.step_cores), the pipeline 18 CPU-ms a batch, serial.
    Overlapped, the pipeline's CPU still lands on cores the step holds: a batch takes at least
    103 + 18 / 2 = 112 ms, so prefetch or a second map thread gains 121 / 112 = ×1.08 (measured
    ×1.01-×1.07), not the ×1.17 of a step on one core that leaves the other to the pipeline."""
    stages = (
        Stage("source (files)", SOURCE, 0.0005, True, False, 5000.0, io_bound=True),
        Stage("map (decode, crop)", MAP, 0.018, True, True, 49152.0),
        Stage("shuffle, repeat", SHUFFLE, 0.0, False, True, 49152.0),
        Stage("batch", BATCH, 0.0, False, True, 49152.0),
    )
    profile = Profile(stages, batch_size=32, examples_per_epoch=960, step_time_s=0.103, epochs=12, step_cores=2)
    budget, start = Budget(2, 1e9), {}
    (overlap,) = plan(profile, budget, start)
    assert overlap.name == "prefetch" and overlap.reason.endswith("(model: ×1.08)")
    # the cores sustain 2 / (18 + 2 x 103 ms) = 8.9 batches/s: one map thread delivers them
    assert water_fill(stages, 0.103, 2, step_cores=2)["map (decode, crop)"] == 1
    one_core = plan(replace(profile, step_cores=1), budget, start)
    assert one_core[0].reason.endswith("(model: ×1.17)")


# JPEGs cropped at random: each crop window decoded (18 ms a batch of 32), or whole images decoded
# (10 ms) before the shuffle and cropped (8 ms) after it.
CROP_WINDOWS = (
    Stage("source (files)", SOURCE, 0.0005, True, False, 5000.0, io_bound=True),
    Stage("shuffle, repeat", SHUFFLE, 0.0, False, True, 5000.0),
    Stage("map (augment)", MAP, 0.018, True, True, 49152.0),
    Stage("batch", BATCH, 0.0, False, True, 49152.0),
)
WHOLE_IMAGES = (
    Stage("source (files)", SOURCE, 0.0005, True, False, 5000.0, io_bound=True),
    Stage("map (decode)", MAP, 0.010, True, False, 12288.0),
    Stage("shuffle, repeat", SHUFFLE, 0.0, False, True, 12288.0),
    Stage("map (augment)", MAP, 0.008, True, True, 49152.0),
    Stage("batch", BATCH, 0.0, False, True, 49152.0),
)


def with_batch_cost(stages, cost_s: float) -> tuple:
    return (*stages[:-1], replace(stages[-1], cost_per_batch_s=cost_s))


def test_jpegs_are_decoded_whole_into_a_cache_only_when_allowed_and_only_with_the_cache():
    """The start above decodes each random crop window (18 ms a batch, nothing deterministic to
    cache); the probe's pipeline decoding whole images spends 10 ms a batch decoding before the
    shuffle and 8 ms cropping after it. Cached, the decode runs in one epoch of 12: the pipeline's
    CPU falls to 8 + 10 / 12 = 8.8 ms a batch, so a batch after prefetch takes (8.8 + 2 x 103) / 2
    = 107.4 ms against (18 + 206) / 2 = 112: ×1.04. It moves cropped pixels by up to two levels,
    so only hydra.sweeper.allow=[decode] lets it in, and never without the cache (decoding whole images
    every epoch costs more than the windows)."""
    profile = Profile(
        CROP_WINDOWS, 32, 960, step_time_s=0.103, epochs=12, step_cores=2, whole_decode_stages=WHOLE_IMAGES
    )
    budget = Budget(2, 1e9)
    assert [proposal.name for proposal in plan(profile, budget, {})] == ["prefetch"]
    allowed = plan(profile, budget, {}, allow=["decode"])
    assert [proposal.name for proposal in allowed] == ["prefetch", "decode whole"]
    decode = allowed[-1]
    assert decode.overrides == {"pipeline.fused_decode_crop": "false", "pipeline.cache": "memory"}
    assert "10.0 ms per batch, measured" in decode.reason and "two levels" in decode.reason
    assert "stages up to map (decode) are deterministic" in decode.reason and decode.reason.endswith("(model: ×1.04)")
    assert decode.predicted_batch_time_s == pytest.approx((0.008 + 0.010 / 12 + 2 * 0.103) / 2)
    # kept, it is replayed first; the plain cache then has nothing left to add
    again = plan(profile, budget, {}, kept=["decode whole"], allow=["decode"])
    assert again[0].overrides == decode.overrides and "cache" not in [proposal.name for proposal in again]
    # no room for an epoch of decoded images (11 MiB), no whole-decode stages probed: nothing
    assert plan(profile, Budget(2, 5 * MIB), {}, allow=["decode"]) == plan(profile, Budget(2, 5 * MIB), {})
    assert plan(replace(profile, whole_decode_stages=None), budget, {}, allow=["decode"]) == plan(profile, budget, {})


def test_the_map_and_the_batch_are_fused_where_the_start_turned_fusion_off():
    """The jpeg start above with tf.data's map-and-batch fusion off (pipeline=naive): the random map
    (18 ms a batch) then the batch (0.5 ms), two ops; the probe measured them fused at 15 ms. Fused,
    the op works a batch ahead of the step (as a prefetch of one), so a batch takes the longest of
    the producer and (the stages' CPU + the step x its 2 held cores) / 2 cores = (15 + 206) / 2 =
    110.5 ms (the files' reading waits, on no core), against 0.5 + 18.5 + 103 = 122 ms unfused
    without prefetch: ×1.10, more than a prefetch of the unfused stages gives ((18.5 + 206) / 2 =
    112.25 ms), so it comes first
    and prefetch has nothing left to add. A start with fusion on, or maps on whole batches, has
    nothing to fuse."""
    stages = with_batch_cost(CROP_WINDOWS, 0.0005)
    profile = Profile(stages, 32, 960, step_time_s=0.103, epochs=12, step_cores=2, fused_map_batch_cost_s=0.015)
    budget = Budget(2, 1e9)
    proposals = plan(profile, budget, {"fused": False})
    assert [proposal.name for proposal in proposals] == ["fuse"]
    fuse = proposals[0]
    assert fuse.overrides == {"pipeline.options.map_and_batch_fusion": "true"}
    assert fuse.predicted_batch_time_s == pytest.approx((0.015 + 2 * 0.103) / 2)
    assert "map (augment) 18.0 ms then batch 0.5 ms per batch" in fuse.reason
    assert "as one op 15.0 ms per batch, measured" in fuse.reason and fuse.reason.endswith("(model: ×1.10)")
    # reverted: the unfused stages' prefetch is weighed again
    assert [proposal.name for proposal in plan(profile, budget, {"fused": False}, rejected=["fuse"])] == ["prefetch"]
    # fusion on in the start, or nothing measured: nothing to fuse
    assert "fuse" not in [proposal.name for proposal in plan(profile, budget, {"fused": True})]
    assert "fuse" not in [p.name for p in plan(replace(profile, fused_map_batch_cost_s=None), budget, {"fused": False})]
    # the maps on whole batches first (far cheaper): nothing left feeds the batch per element
    vectorizable = replace(profile, vectorized_map_cost_s=0.002)
    names = [proposal.name for proposal in plan(vectorizable, budget, {"fused": False})]
    assert names[0] == "vectorize" and "fuse" not in names
    # kept, then decoded whole (hydra.sweeper.allow=[decode]): the crops' map and the batch stay one op
    decodable = replace(profile, whole_decode_stages=with_batch_cost(WHOLE_IMAGES, 0.0005))
    decode = plan(decodable, budget, {"fused": False}, kept=["fuse"], allow=["decode"])[-1]
    assert decode.name == "decode whole"
    assert decode.predicted_batch_time_s == pytest.approx((0.010 / 12 + 0.0085 + 2 * 0.103) / 2)


def test_uint8_transfer_is_proposed_only_for_integer_features_within_a_byte():
    """A lossless change only: uint8 where the probe found integer features in [0, 255]
    (test_tune_probe.py checks that finding), never for floats or wider integers."""
    stages = (  # bytes cast to float32 before the shuffle (a 6 ms map a batch that uint8 leaves out)
        Stage("source", SOURCE, 0.002, output_bytes_per_example=3072),
        Stage("map (cast)", MAP, 0.006, True, False, 12288),
        Stage("shuffle, repeat", SHUFFLE, 0.0015, False, True, 12288),
        Stage("map (augment)", MAP, 0.110, True, True, 12288),
        Stage("batch", BATCH, 0.003, False, True, 12288),
    )

    def transfers(integer_features: bool):
        profile = Profile(stages, 512, 13107, 0.0096, integer_features=integer_features, epochs=3)
        profile = replace(profile, feature_bytes_per_example=12288)
        return [p for p in plan(profile, Budget(2, 4e9), {}) if "pipeline.transfer_dtype" in p.overrides]

    (uint8,) = transfers(True)
    assert uint8.overrides == {"pipeline.transfer_dtype": "uint8"}
    assert "integers in [0, 255]: uint8 carries them exactly, a quarter of float32's 12,288 bytes" in uint8.reason
    assert "the cast map (6.0 ms per batch) goes" in uint8.reason
    assert transfers(False) == []
