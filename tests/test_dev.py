"""The README's commands: help comes without set-up downloads."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", ["demo", "demo --reward", "demo --rerank", "demo --embed", "finetune", "real"])
def test_help_does_not_download_the_checkpoints(command, tmp_path):
    env = {**os.environ, "STABLE_MODELS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [str(ROOT / "dev"), *command.split(), "--help"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout
    assert not (tmp_path / "cache").exists()  # nothing fetched


def test_readme_outputs_compare_sees_a_changed_output_and_not_a_new_version(tmp_path, capsys):
    """scripts/readme_outputs.py compare: equal outputs under a new version (other code files and hashes) pass, a
    changed prediction file fails."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("readme_outputs", ROOT / "scripts" / "readme_outputs.py")
    readme_outputs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme_outputs)

    def listing(folder, version, scores):
        folder.mkdir()
        config = {"num_labels": 2, "stable_models_version": version, "stable_models_code_sha256": {"a": version}}
        outputs = {"c:clf/config.json": config, "c:clf/modeling_stable.py": version, "c:scores.jsonl": scores}
        (folder / "listing.json").write_text(json.dumps(outputs))
        return folder

    old = listing(tmp_path / "old", "0.3.0", "ab12")
    assert readme_outputs.compare(old, listing(tmp_path / "new", "0.4.0", "ab12")) == 0
    assert readme_outputs.compare(old, listing(tmp_path / "moved", "0.4.0", "cd34")) == 1
    assert "differs: c:scores.jsonl" in capsys.readouterr().out
