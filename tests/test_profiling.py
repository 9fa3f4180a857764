"""The profiler writes a trace that holds exactly the chosen steps, read back from its XSpace proto."""

from pathlib import Path

from bwopt.profiling import StepProfiler


def traced_step_numbers(xplane_path: Path) -> list:
    """The step_num of every `train` step event in a profile, in order."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(xplane_path.read_bytes())
    step_numbers = []
    for plane in space.planes:
        event_names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if event_names.get(event.metadata_id) == "train":
                    stats = {stat_names[stat.metadata_id]: stat.int64_value for stat in event.stats}
                    step_numbers.append(stats["step_num"])
    return sorted(step_numbers)


def run_steps(profiler: StepProfiler, num_steps: int) -> None:
    import tensorflow as tf

    @tf.function
    def step(x):
        return tf.reduce_sum(tf.matmul(x, x))

    x = tf.ones((32, 32))
    for number in range(num_steps):
        profiler.on_step_begin(number)
        float(step(x))
        profiler.on_step_end(number)


def test_trace_holds_exactly_the_chosen_steps(tmp_path):
    profiler = StepProfiler(str(tmp_path), (2, 3))
    run_steps(profiler, 6)
    assert not profiler.running
    (trace,) = (tmp_path / "plugins" / "profile").glob("*/*.xplane.pb")
    assert traced_step_numbers(trace) == [2, 3]


def test_close_writes_a_trace_cut_short_and_zero_steps_trace_nothing(tmp_path):
    cut_short = StepProfiler(str(tmp_path / "cut"), tuple(range(1, 101)))
    run_steps(cut_short, 3)
    assert cut_short.running
    cut_short.on_loop_end()  # the loop ended (or raised) inside the range
    (trace,) = (tmp_path / "cut" / "plugins" / "profile").glob("*/*.xplane.pb")
    assert traced_step_numbers(trace) == [1, 2]

    run_steps(StepProfiler(str(tmp_path / "off"), ()), 2)
    assert not (tmp_path / "off").exists()
