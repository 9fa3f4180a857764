"""data=sample_images: real JPEGs made once from scikit-learn's sample photograph, cached atomically."""

from collections import Counter
from pathlib import Path

import pytest
from conftest import compose_config

from bwopt.app import validate
from bwopt.data import sample_images
from bwopt.data.sample_images import CLASS_NAMES, MANIFEST, load_sample_images, make_sample_images
from bwopt.schema.data import SampleImagesData


def settings(directory: Path, **changes) -> SampleImagesData:
    return SampleImagesData(**{"num_images": 16, "directory": str(directory), **changes})


def test_the_images_are_jpegs_of_the_configured_sizes_in_three_balanced_classes(tmp_path):
    from PIL import Image

    folder = make_sample_images(settings(tmp_path, num_images=15, saved_side_px=[40, 60]))
    files = sorted(folder.glob("*/*.jpg"))
    assert Counter(path.parent.name for path in files) == {name: 5 for name in CLASS_NAMES}
    for path in files:
        with Image.open(path) as image:
            assert image.format == "JPEG" and 40 <= max(image.size) <= 60
    source = load_sample_images(settings(tmp_path, num_images=15, saved_side_px=[40, 60], image_size=[8, 8]), 0, 0.2)
    assert source.class_names == list(CLASS_NAMES) and source.feature_shape == (8, 8, 3)
    assert Counter(source.labels.tolist()) == {0: 5, 1: 5, 2: 5}


def test_where_the_sky_is_gives_the_class(tmp_path):
    """The sky (bright) is in the top third of an upright image, the bottom third of an upside-down
    one and the left or right third of a sideways one, more often than anywhere else."""
    import numpy as np
    from PIL import Image

    expected = {"upright": {"top"}, "upside_down": {"bottom"}, "sideways": {"left", "right"}}
    folder = make_sample_images(settings(tmp_path, num_images=60, generator_seed=3))
    right = 0
    for name in CLASS_NAMES:
        for path in sorted((folder / name).glob("*.jpg")):
            image = np.asarray(Image.open(path), dtype=np.float32)
            rows, columns = image.shape[0] // 3, image.shape[1] // 3
            thirds = {
                "top": image[:rows].mean(),
                "bottom": image[-rows:].mean(),
                "left": image[:, :columns].mean(),
                "right": image[:, -columns:].mean(),
            }
            right += max(thirds, key=thirds.get) in expected[name]
    assert right >= 0.6 * 60


def test_a_second_call_reuses_the_folder_without_writing(tmp_path, monkeypatch):
    config = settings(tmp_path)
    folder = make_sample_images(config)
    mtimes = {path: path.stat().st_mtime_ns for path in folder.rglob("*")}

    def must_not_write(*args):
        raise AssertionError("the images were written again")

    monkeypatch.setattr(sample_images, "write_images", must_not_write)
    assert make_sample_images(config) == folder
    assert {path: path.stat().st_mtime_ns for path in folder.rglob("*")} == mtimes
    # Other generator settings make another folder; the decode size is not one of them.
    assert make_sample_images(settings(tmp_path, image_size=[32, 32])) == folder
    monkeypatch.undo()
    assert make_sample_images(settings(tmp_path, generator_seed=1)) != folder


def test_an_interrupted_write_leaves_no_folder(tmp_path, monkeypatch):
    write_images = sample_images.write_images

    def write_then_fail(photos, settings, folder):
        write_images(photos, settings, folder)
        raise KeyboardInterrupt

    monkeypatch.setattr(sample_images, "write_images", write_then_fail)
    with pytest.raises(KeyboardInterrupt):
        make_sample_images(settings(tmp_path))
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy
    monkeypatch.undo()
    assert (make_sample_images(settings(tmp_path)) / MANIFEST).is_file()


def test_the_config_validates_its_generator_settings():
    with pytest.raises(Exception, match=r"data.saved_side_px=\[300, 200\] is invalid"):
        validate(compose_config(["data=sample_images", "data.saved_side_px=[300,200]"]))
    with pytest.raises(Exception, match=r"data.image_size=\[64\] is invalid; expected \[height, width\]"):
        validate(compose_config(["data=sample_images", "data.image_size=[64]"]))


@pytest.mark.slow
def test_an_end_to_end_run_on_sample_images_finishes(run_experiment, tmp_path):
    summary = run_experiment(
        "tracking=none",
        "data=sample_images",
        f"data.directory={tmp_path / 'cache'}",
        "data.num_images=48",
        "data.image_size=[16,16]",
        "pipeline.preprocess=imagenet",
        "pipeline.vectorized_map=false",
        "pipeline.cache=memory",
        "model=cnn",
        "train.global_batch_size=8",
        "train.epochs=2",
        "train.warmup_steps=1",
        "measure.memcpy_bandwidth=false",
    )
    assert summary.status == "FINISHED" and summary.figures.num_timed_steps > 0
