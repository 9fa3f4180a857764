"""What a resume may change: how long it trains and what is measured after; never what it trains."""

from bwopt.checkpoint import changed_keys, may_change


def test_only_the_keys_that_do_not_change_the_training_may_differ_on_resume():
    stopped = {
        "train.epochs": "4",
        "train.learning_rate": "0.01",
        "measure.ceilings": "false",
        "tracking.tags.owner": "a",
        "model.hidden_units": "[128]",
    }
    now = {**stopped, "train.epochs": "9", "measure.ceilings": "true", "tracking.tags.owner": "b"}
    assert changed_keys(stopped, now) == []
    now.update({"train.learning_rate": "0.1", "model.hidden_units": "[16]"})
    assert changed_keys(stopped, now) == [
        "model.hidden_units=[128] (now [16])",
        "train.learning_rate=0.01 (now 0.1)",
    ]


def test_a_key_added_or_dropped_is_a_change_and_prefixes_match_whole_segments():
    assert changed_keys({"pipeline.prefetch": "2"}, {}) == ["pipeline.prefetch=2 (now (absent))"]
    assert changed_keys({}, {"pipeline.cache": "memory"}) == ["pipeline.cache=(absent) (now memory)"]
    assert may_change("measure.plots") and may_change("tracking.tags.team") and may_change("train.epochs")
    assert not may_change("measure") and not may_change("train.epochs_extra") and not may_change("tracking.uri")
