"""A sweep names a best setting only when it beats the runner-up beyond the noise."""

from bwopt.sweep.compare import rank


def test_a_clear_winner_is_named_with_its_interval():
    ranking = rank(
        {
            "prefetch=2": ([2000.0, 2050.0, 1980.0], [[1950.0, 2060.0]] * 3),
            "prefetch=0": ([1000.0, 1010.0, 990.0], [[980.0, 1020.0]] * 3),
        }
    )
    assert ranking.best == "prefetch=2" and ranking.order == ["prefetch=2", "prefetch=0"]
    assert ranking.against_leader["prefetch=0"].word == "slower"
    assert ranking.sentence.startswith("Best: prefetch=2, ×2.0") and "95 % CI" in ranking.sentence


def test_settings_inside_the_noise_tie_and_the_sentence_says_how_many_repeats_would_tell():
    # The "best" of the issue: autotune 47,801 (33,345–62,258) over prefetch=2 at 43,704 (32,948–54,460).
    ranking = rank(
        {
            "pipeline.prefetch=autotune": ([62258.0, 33345.0], [None, None]),
            "pipeline.prefetch=2": ([54460.0, 32948.0], [None, None]),
            "pipeline.prefetch=0": ([9000.0, 9500.0], [None, None]),
        }
    )
    assert ranking.best is None
    assert ranking.against_leader["pipeline.prefetch=2"].word == "no difference detected"
    assert ranking.against_leader["pipeline.prefetch=0"].word == "slower"
    assert ranking.sentence.startswith(
        "No best: pipeline.prefetch=autotune and pipeline.prefetch=2 tie "
        "(pipeline.prefetch=autotune vs pipeline.prefetch=2: ×"
    )
    assert "), no difference detected)" in ranking.sentence
    assert "repeats per setting would resolve" in ranking.sentence


def test_one_run_per_setting_uses_each_runs_own_interval():
    narrow = rank({"a": ([1100.0], [[1090.0, 1110.0]]), "b": ([1000.0], [[990.0, 1010.0]])})
    wide = rank({"a": ([1100.0], [[800.0, 1400.0]]), "b": ([1000.0], [[700.0, 1300.0]])})
    assert narrow.best == "a" and wide.best is None


def test_with_few_repeats_equal_settings_are_called_different_at_most_about_5_percent_of_the_time():
    """Two settings of equal speed, 2 or 3 repeats each, 4 % run-to-run noise: a normal interval
    on the repeats' own spread would call a difference in 18 % of such sweeps at 2 repeats (12 %
    at 3); with the pooled spread and Student's t, about 5 % or fewer."""
    import numpy as np

    rng = np.random.default_rng(0)
    for repeats in (2, 3):
        called = 0
        for _ in range(2000):
            a, b = np.exp(rng.normal(np.log(1000.0), 0.04, size=(2, repeats)))
            called += rank({"a": (list(a), [None] * repeats), "b": (list(b), [None] * repeats)}).best is not None
        assert called / 2000 <= 0.065, (repeats, called)
    found = 0  # and a real 1.3x difference at 3 repeats is still found
    for _ in range(500):
        a, b = np.exp(rng.normal(np.log([[1300.0], [1000.0]]), 0.04, size=(2, 3)))
        found += rank({"a": (list(a), [None] * 3), "b": (list(b), [None] * 3)}).best == "a"
    assert found / 500 >= 0.9, found


def test_a_leader_that_ties_any_setting_below_the_runner_up_is_not_named_best():
    """The runner-up by estimate need not be the closest call: a setting further down with a wide
    interval (one noisy run) still overlaps the leader, so there is no best."""
    ranking = rank(
        {"a": ([110.0], [[109.0, 111.0]]), "b": ([104.0], [[103.0, 105.0]]), "c": ([100.0], [[60.0, 170.0]])}
    )
    assert ranking.order == ["a", "b", "c"] and ranking.against_leader["b"].word == "slower"
    assert ranking.against_leader["c"].word == "no difference detected"
    assert ranking.best is None and ranking.sentence.startswith("No best: a and c tie (a vs c")
    clear = rank({"a": ([110.0], [[109.0, 111.0]]), "b": ([104.0], [[103.0, 105.0]]), "c": ([100.0], [[98.0, 102.0]])})
    assert clear.best == "a" and "the runner-up b" in clear.sentence
