"""The README's commands: help comes without set-up downloads."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", ["demo", "finetune", "real"])
def test_help_does_not_download_the_checkpoints(command, tmp_path):
    env = {**os.environ, "STABLE_MODELS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [str(ROOT / "dev"), command, "--help"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout
    assert not (tmp_path / "cache").exists()  # nothing fetched
