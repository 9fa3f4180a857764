"""The probe's picture of an image pipeline, and what tune plans from it (real tf.data, in process)."""

import numpy as np
import pytest
from conftest import compose_config, small_sample_images

from bwopt.app import validate
from bwopt.sweep.tune_decide import Budget
from bwopt.sweep.tune_plan import plan
from bwopt.sweep.tune_record import Trial
from bwopt.sweep.tune_setup import profile_of, start_knobs

pytestmark = pytest.mark.slow  # TensorFlow and two probes of real JPEGs


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """data=sample_images: 150 JPEGs of 40-64 px, imagenet's random crops, 3 epochs of 12 batches."""
    return [
        *small_sample_images(tmp_path_factory.mktemp("sample_images"), 150),
        "pipeline=naive",
        "train.global_batch_size=10",
        "train.epochs=3",
    ]


def planned(overrides, allow=()):
    from bwopt.sweep.tune_probe import probe

    picture = probe(overrides, whole_decode="decode" in allow)
    config = validate(compose_config(overrides))
    profile = profile_of(picture, Trial(0, "start", "", {}))
    proposals = plan(profile, Budget(2, 1e9), start_knobs(config, 2), allow=allow)
    return picture, {proposal.name: proposal for proposal in proposals}


def crops_cost_something(stages):
    """The random map after the shuffle, cutting crops from decoded images, keeps a cost: on images
    this small, decoding timed alone can outweigh the whole map measured in the pipeline."""
    shuffle = next(index for index, stage in enumerate(stages) if stage["kind"] == "shuffle")
    random_map = next(stage for stage in stages[shuffle:] if stage["kind"] == "map")
    assert random_map["cost_per_batch_s"] > 0.1 * sum(stage["cost_per_batch_s"] for stage in stages), stages


def test_images_decoded_whole_are_probed_with_the_decoding_apart_and_tune_caches_them(images):
    from bwopt.data.sources import load_source
    from bwopt.inputs import plan as input_plan
    from bwopt.memory import decoded_pixels

    # fusion on in the start: nothing to fuse, no window for it (the probe itself runs unfused)
    fused_on = [*images, "pipeline.fused_decode_crop=false", "pipeline.options.map_and_batch_fusion=true"]
    picture, proposals = planned(fused_on, allow=["decode"])
    assert picture["fused_map_batch_cost_s"] is None and "fuse" not in proposals
    names = [stage["name"] for stage in picture["stages"]]
    assert names.index("map (decode)") < names.index("shuffle, repeat"), names
    decode = picture["stages"][names.index("map (decode)")]
    assert not decode["random"] and decode["cost_per_batch_s"] > 0
    crops_cost_something(picture["stages"])
    # what it hands on is the decoded images, as many bytes as their headers say
    config = validate(compose_config(images))
    source = load_source(config.data, config.seed, config.split.validation_fraction)
    files = source.files[input_plan(config, source).train_indices]
    mean_bytes = 3 * np.mean(decoded_pixels(source, files, config.data))
    assert decode["output_bytes_per_example"] == pytest.approx(mean_bytes, rel=0.25)
    cache = proposals["cache"]
    assert cache.overrides == {"pipeline.cache": "memory"}
    assert cache.reason.startswith("stages up to map (decode) are deterministic"), cache.reason

    # it decodes whole images already: no second window, nothing for hydra.sweeper.allow=[decode] to propose
    assert picture["whole_decode_stages"] is None and "decode whole" not in proposals

    # decoding only the crop window is random: nothing before the shuffle but the read, which a cache may hold
    picture, proposals = planned(images, allow=["decode"])
    names = [stage["name"] for stage in picture["stages"]]
    # pipeline=naive turns tf.data's map-and-batch fusion off: the two fused are timed in a window of their own
    unfused = sum(stage["cost_per_batch_s"] for stage in picture["stages"] if stage["kind"] in ("map", "batch"))
    assert 0.3 * unfused < picture["fused_map_batch_cost_s"] < 2 * unfused, (picture["fused_map_batch_cost_s"], unfused)
    assert "map (decode)" not in names[: names.index("shuffle, repeat")], names
    if "cache" in proposals:
        assert proposals["cache"].reason.startswith("stages up to source"), proposals["cache"].reason
    # hydra.sweeper.allow=[decode]: the same pipeline decoding whole images, probed in a window of its own
    whole = picture["whole_decode_stages"]
    names = [stage["name"] for stage in whole]
    assert names.index("map (decode)") < names.index("shuffle, repeat"), names
    assert whole[names.index("map (decode)")]["output_bytes_per_example"] == pytest.approx(mean_bytes, rel=0.25)
    crops_cost_something(whole)
    decode = proposals["decode whole"]
    assert decode.overrides == {"pipeline.fused_decode_crop": "false", "pipeline.cache": "memory"}
    assert "stages up to map (decode) are deterministic" in decode.reason


def test_uint8_carries_the_features_exactly_only_for_integers_within_a_byte():
    """The probe's finding that lets *transfer uint8* in, on the bundled sources and on arrays
    outside it: integers within [0, 255] as stored, never floats or wider values."""
    from bwopt.data.sources import ArraySource, load_source
    from bwopt.inputs import plan as input_plan
    from bwopt.sweep.tune_probe import exact_in_uint8

    def exact(overrides=(), features=None) -> bool:
        config = validate(compose_config(overrides))
        source = load_source(config.data, config.seed, config.split.validation_fraction)
        if features is not None:
            source = ArraySource(features, source.labels[: len(features)], source.num_classes, 1.0)
        return exact_in_uint8(input_plan(config, source), source)

    labels = 1797  # digits' examples
    assert exact(["data=digits"]) and exact(["data=synthetic"])  # uint8 arrays, 0-16 and 0-255
    assert not exact(["data=artificial", "split=uniform", "train.warmup_steps=1"])  # float32, read from files
    assert not exact(["data=digits"], np.full((labels, 64), 0.5, np.float32))
    assert not exact(["data=digits"], np.full((labels, 64), 300, np.int16))
    assert exact(["data=digits"], np.full((labels, 64), 255, np.int16))  # integers in a byte, stored wider
