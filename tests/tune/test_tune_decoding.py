"""How the probe moves the decoding of whole images out of a random map: the split of the map's
measured cost by the decoding and the crops timed alone (pure arithmetic, no TensorFlow)."""

import pytest

from bwopt.sweep.tune_decoding import DecodingCost, with_decoding_apart


def stages(random_map_s: float):
    """A decode-apart start as the probe reads it: the files, shuffle, the random map, batch."""

    def stage(name, kind, cost, random):
        return {"name": name, "node": name, "kind": kind, "cost_per_batch_s": cost, "random": random}

    return [
        stage("source (files)", "source", 0.001, False),
        stage("shuffle, repeat", "shuffle", 0.0005, True),
        stage("map (decode)", "map", random_map_s, True),
        stage("batch", "batch", 0.0002, True),
    ]


def test_the_decoding_moves_before_the_shuffle_and_the_map_keeps_the_rest():
    # 32 images a batch: 0.3 ms each to decode, 0.05 ms to crop, in a map measured at 14 ms a batch
    apart = with_decoding_apart(stages(0.014), DecodingCost(0.0003, 0.00005, 116_650.0), 32)
    assert [stage["name"] for stage in apart] == [
        "source (files)",
        "map (decode)",
        "shuffle, repeat",
        "map (decode)",
        "batch",
    ]
    decode, random_map = apart[1], apart[3]
    assert not decode["random"] and decode["parallel"]
    assert decode["output_bytes_per_example"] == 116_650.0
    assert decode["cost_per_batch_s"] == pytest.approx(0.0096)
    # what stays after the shuffle is the rest of the measured map: crops, seeds and the cast
    assert random_map["cost_per_batch_s"] == pytest.approx(0.014 - 0.0096)


def test_costs_timed_alone_beyond_the_measured_map_are_scaled_down_to_it_and_the_crops_keep_their_share():
    # tiny images: decoding alone reads 0.5 ms an image, cropping 0.1 ms, the map 12 ms a batch of 32
    apart = with_decoding_apart(stages(0.012), DecodingCost(0.0005, 0.0001, 9_000.0), 32)
    decode, random_map = apart[1], apart[3]
    assert decode["cost_per_batch_s"] + random_map["cost_per_batch_s"] == pytest.approx(0.012)
    assert random_map["cost_per_batch_s"] == pytest.approx(0.012 / 6)  # the crops' 1 in 6, not 0
    assert decode["cost_per_batch_s"] == pytest.approx(0.012 * 5 / 6)


def test_nothing_timed_moves_nothing():
    apart = with_decoding_apart(stages(0.012), DecodingCost(0.0, 0.0, 9_000.0), 32)
    assert apart[1]["cost_per_batch_s"] == 0.0 and apart[3]["cost_per_batch_s"] == pytest.approx(0.012)
