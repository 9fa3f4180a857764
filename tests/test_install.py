"""A default editable install (`pip install -e .`) runs from any folder: Hydra gets bwopt's plugins.

Its import hook serves the `hydra_plugins` namespace without a folder that Hydra's plugin scan could
list, so these runs depend on bwopt.plugins registering the launcher and the sweeper itself.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow
TINY = ["train.epochs=1", "train.warmup_steps=2", "train.steps_per_epoch=6", "measure.memcpy_bandwidth=false"]
TINY += ["tracking=none"]
# Nothing of this checkout on the path: bwopt must come from the install.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    """The python of a fresh venv holding bwopt as a default editable install of this checkout.

    Offline: the venv reaches this interpreter's packages (TensorFlow, pip, setuptools) through a
    .pth file, whose folders Python adds without running their own .pth files, so an install of
    bwopt there (compat mode: the checkout on the path) stays out.
    """
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    where = [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = subprocess.run(where, capture_output=True, text=True, check=True, env=ENV).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site) / "dependencies.pth").write_text("".join(f"{folder}\n" for folder in ours))
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps"]
    subprocess.run([*install, "--no-build-isolation", "-e", REPO], check=True, cwd=venv, env=ENV)
    imported = [python, "-c", "import bwopt, hydra_plugins.bwopt_launcher as p; print(bwopt.__file__, p.__file__)"]
    files = subprocess.run(imported, capture_output=True, text=True, check=True, cwd=venv, env=ENV).stdout.split()
    assert all(file.startswith(str(REPO)) for file in files), files
    return python


def bwopt(python, *args, cwd):
    result = subprocess.run([python, "-m", "bwopt", *args], cwd=cwd, capture_output=True, text=True, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_run_from_another_folder(python, tmp_path):
    bwopt(python, *TINY, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "FINISHED"


def test_a_sweep_from_another_folder_runs_every_job_through_bwopts_launcher(python, tmp_path):
    bwopt(python, "-m", "pipeline.prefetch=0,2", *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    jobs = [json.loads((tmp_path / "sweep" / str(n) / "job.json").read_text()) for n in (0, 1)]  # the launcher's
    assert [job["overrides"][0] for job in jobs] == ["pipeline.prefetch=0", "pipeline.prefetch=2"]
    assert all((tmp_path / "sweep" / str(n) / "summary.json").is_file() for n in (0, 1))


def test_a_search_from_another_folder_uses_bwopts_sweeper(python, tmp_path):
    search = ["-m", "hparams_search=pipeline", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={tmp_path / 'search'}"]
    bwopt(python, *search, *TINY, cwd=tmp_path)
    assert "num_complete: 1" in (tmp_path / "search" / "search.yaml").read_text()
