"""Slow episodes: the stretches of a timed window whose rate fell below 0.6 of its median, found
where a timeline (or the user's pipeline) put them."""

import textwrap

import numpy as np
import pytest

from bwopt.measure.episodes import slow_episodes, windows
from bwopt.terminal import figure_rows


def test_windows_hold_at_least_half_a_second_and_the_rest_joins_the_last():
    cut = windows(np.full(23, 0.1))
    assert [(part.start, part.stop) for part in cut] == [(0, 5), (5, 10), (10, 15), (15, 23)]
    assert [(part.start, part.stop) for part in windows(np.full(3, 0.1))] == [(0, 3)]
    assert [(part.start, part.stop) for part in windows(np.array([2.0, 0.1]))] == [(0, 2)]


def test_a_known_slow_stretch_is_one_episode_of_its_length_and_share():
    # 10 ms steps for 3 s, 50 ms steps (a fifth of the rate) for 1 s, 10 ms steps for 2 s
    steps = np.concatenate([np.full(300, 0.01), np.full(20, 0.05), np.full(200, 0.01)])
    episodes = slow_episodes(steps)
    assert episodes.slow_episodes == 1
    assert episodes.longest_slow_episode_s == pytest.approx(1.0)
    assert episodes.slow_time_fraction == pytest.approx(1 / 6)
    assert episodes.rate_windows == 12


def test_an_even_window_has_no_episode_and_the_spread_of_its_windows():
    rng = np.random.default_rng(0)
    episodes = slow_episodes(rng.normal(0.01, 0.002, 1000))
    assert episodes.slow_episodes == 0 and episodes.slow_time_fraction == 0
    assert episodes.longest_slow_episode_s == 0
    assert 0 < episodes.rate_window_spread < 0.05  # 50 steps a window: 0.2 / sqrt(50) ~ 3 %


def test_two_stretches_are_two_episodes_and_too_short_a_window_says_nothing():
    fast, slow = np.full(50, 0.01), np.full(10, 0.05)
    episodes = slow_episodes(np.concatenate([fast, slow, fast, fast, slow, fast, fast]))
    assert episodes.slow_episodes == 2 and episodes.longest_slow_episode_s == pytest.approx(0.5)
    assert slow_episodes(np.full(150, 0.01)) is None  # 1.5 s: three windows


def test_the_rate_row_gives_the_windows_spread_and_names_the_episodes_and_the_cure():
    even = {"rate_windows": 6, "rate_window_spread": 0.04, "slow_episodes": 0}
    assert dict(figure_rows(even))["rate"] == "6 windows of 0.5 s scatter 4 %; none below 0.6 of their median"
    uneven = {**even, "slow_episodes": 2, "slow_time_fraction": 0.18, "longest_slow_episode_s": 0.92}
    row = dict(figure_rows(uneven))["rate"]
    assert row.startswith("6 windows of 0.5 s scatter 4 %; 2 slow episodes (below 0.6 of their median) took 18 %")
    assert "the longest 0.9 s" in row and row.endswith("compare settings over repeats (hydra.launcher.repeats)")


PACED = """
import time

import numpy as np
import tensorflow as tf

SLOW_EVERY_S, SLOW_FOR_S = 4.0, 1.0
STARTED = []


def pause(index):
    # 0.3 ms an example, 2 ms during the first second of every four: a fifth of the rate
    STARTED.append(STARTED[0] if STARTED else time.monotonic())
    slow = (time.monotonic() - STARTED[0]) % SLOW_EVERY_S < SLOW_FOR_S
    time.sleep(0.002 if slow else 0.0003)
    return index


def examples(num_examples=2000):
    features = np.zeros((num_examples, 4), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, np.arange(num_examples) % 2))
    return dataset.map(lambda x, y: (x, tf.ensure_shape(tf.numpy_function(pause, [y], tf.int64), [])))
"""


@pytest.mark.slow  # a real run: 8 s of timed steps
@pytest.mark.timing  # another test's work on the cores reads as a slow window of its own
def test_a_pipeline_slow_one_second_in_four_is_found_uneven_for_about_a_quarter_of_the_window(
    tmp_path, monkeypatch, run_experiment
):
    (tmp_path / "paced_data.py").write_text(textwrap.dedent(PACED))
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = run_experiment(
        "tracking=none",
        "data=custom",
        "data._target_=paced_data.examples",
        "data.num_classes=2",
        "split=uniform",
        "pipeline=naive",
        "model=mlp",
        "train.global_batch_size=16",
        "train.epochs=1",
        "measure.min_timed_s=8",
        "measure.memcpy_bandwidth=false",
        "measure.progress=false",
        "measure.plots=false",
    )
    figures = summary.figures
    # two or three slow seconds in 8-9 s; a window that straddles an edge counts whole or not at all
    assert 2 <= figures.slow_episodes <= 3, figures
    assert 0.12 <= figures.slow_time_fraction <= 0.45, figures
    assert 0.4 <= figures.longest_slow_episode_s <= 1.6, figures


def test_stretches_of_windows_of_any_length_are_what_a_run_and_a_series_share():
    from bwopt.measure.episodes import slow_stretches

    slow, lengths = slow_stretches([10, 3, 2, 10, 10, 4, 10], [0.5, 0.5, 1.0, 0.5, 0.5, 0.5, 0.5])
    assert slow.tolist() == [False, True, True, False, False, True, False]
    assert lengths == [1.5, 0.5]
    assert slow_stretches([10, 10, 3], [0.5] * 3)[1] == [0.5]  # an episode at the end is one
