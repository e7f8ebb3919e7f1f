"""A downloaded folder runs no code the user did not install: every loader of the package and every command that takes
`--model` builds the class from the installed package, not from the folder's code files; `stable-models verify`
tells a release's code files from changed ones; the model card says both ways to load."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from architectures import BY_NAME
from test_doctor import save_checkpoint
from tiny_tokenizers import qwen2_like
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import stable_models
from stable_models import cli
from stable_models.modeling_files import CODE_VERSION
from stable_models.verify import MANIFEST, installed_code, verify_folder

FIXTURES = Path(__file__).parent / "fixtures"
TEXTS = ["the film was great", "bad", "a very dull plot but good actor"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A Stable Qwen2 classifier folder, saved with its tokenizer, and its logits on TEXTS."""
    folder = tmp_path_factory.mktemp("trust")
    base = save_checkpoint(folder / "base", "qwen2", qwen2_like())
    model = stable_models.from_pretrained(base, num_labels=2, id2label={0: "neg", 1: "pos"}).eval()
    model.save_pretrained(folder / "clf")
    AutoTokenizer.from_pretrained(base).save_pretrained(folder / "clf")
    return folder / "clf", logits_of(model, folder / "clf")


def logits_of(model, folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return model.eval()(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits


def poisoned(folder, tmp_path):
    """A copy whose every code file writes a marker file when it is imported."""
    copy = tmp_path / "downloaded"
    shutil.copytree(folder, copy)
    marker = tmp_path / "the-folder's-code-ran"
    for code in copy.glob("*.py"):
        code.write_text(f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n" + code.read_text())
    return copy, marker


LOADERS = {
    "stable_models.from_pretrained": lambda folder: stable_models.from_pretrained(folder),
    "StableQwen2ForSequenceClassification.from_pretrained": lambda folder: (
        stable_models.StableQwen2ForSequenceClassification.from_pretrained(folder)
    ),
    "... with trust_remote_code=True passed": lambda folder: (
        stable_models.StableQwen2ForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    ),
    "the stock class, no trust_remote_code": lambda folder: AutoModelForSequenceClassification.from_pretrained(folder),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_loading_runs_no_code_from_the_folder(loader, classifier, tmp_path):
    folder, expected = classifier
    copy, marker = poisoned(folder, tmp_path)
    model = LOADERS[loader](copy)
    assert not marker.exists()
    if loader != "the stock class, no trust_remote_code":
        assert type(model).__module__.startswith("stable_models")
        assert (logits_of(model, copy) - expected).abs().max() <= 1e-6


def test_the_marker_works_trust_remote_code_runs_the_folders_code(classifier, tmp_path):
    """The control: AutoModel with trust_remote_code=True imports the folder's files, in a fresh interpreter."""
    folder, _ = classifier
    copy, marker = poisoned(folder, tmp_path)
    code = (
        "from transformers import AutoModelForSequenceClassification as A; import sys; "
        "m = A.from_pretrained(sys.argv[1], trust_remote_code=True); print(type(m).__module__)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert marker.read_text() == "ran" and "transformers_modules" in done.stdout


def test_every_command_that_takes_a_model_runs_no_code_from_the_folder(classifier, tmp_path, capsys):
    folder, _ = classifier
    copy, marker = poisoned(folder, tmp_path)
    rows = [{"text": t, "label": label} for t, label in zip(TEXTS * 4, ["pos", "neg", "neg"] * 4, strict=True)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = {
        "train": ["train", "--model", copy, "--train", data, "--output", tmp_path / "t", "--max-steps", "1"]
        + ["--eval-steps", "1", "--dtype", "fp32", "--batch-size", "4"],
        "evaluate": ["evaluate", "--model", copy, "--data", data, "--report-dir", tmp_path / "e"],
        "predict": ["predict", "--model", copy, "--data", data, "--output", tmp_path / "p.jsonl"],
        "verify": ["verify", copy],
    }
    for name, argv in runs.items():
        assert cli.main([str(a) for a in argv]) in ((1,) if name == "verify" else (0,)), name
        assert not marker.exists(), name
    assert cli.main(["doctor", "--model", str(copy), "--max-examples", "4"]) in (0, 1)
    assert not marker.exists()
    assert "do not load it with trust_remote_code=True" in capsys.readouterr().out


def test_a_fresh_save_verifies_and_records_its_version_and_hashes(classifier, capsys):
    folder, _ = classifier
    config = json.loads((folder / "config.json").read_text())
    assert config["stable_models_version"] == CODE_VERSION == stable_models.__version__
    recorded = config["stable_models_code_sha256"]
    assert set(recorded) == {p.name for p in folder.glob("*.py")} and recorded == {
        name: digest for name, digest in installed_code().items() if name in recorded
    }
    assert cli.main(["verify", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"verified: every code file is byte-identical to stable_models {CODE_VERSION}'s" in out
    stable_models.check_checkpoint(str(folder))


@pytest.mark.parametrize("change", ["one byte", "unknown file", "missing file", "replaced by another release's"])
def test_a_changed_folder_fails_verify_naming_the_file(change, classifier, tmp_path, capsys):
    folder, _ = classifier
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    if change == "one byte":
        path = copy / "modeling_loss.py"
        data = bytearray(path.read_bytes())
        data[100] ^= 1
        path.write_bytes(bytes(data))
        expected = "modeling_loss.py: modified"
    elif change == "unknown file":
        (copy / "helpers.py").write_text("x = 1\n")
        expected = "helpers.py: unknown"
    elif change == "missing file":
        (copy / "modeling_masks.py").unlink()
        expected = "modeling_masks.py: missing"
    else:
        shutil.copy(FIXTURES / "release-0.1.0" / "modeling_stable.py", copy / "modeling_stable.py")
        expected = "modeling_stable.py: replaced"
    assert cli.main(["verify", str(copy)]) == 1
    assert expected in capsys.readouterr().out
    with pytest.raises(ValueError, match=expected.split(":")[0]):
        stable_models.check_checkpoint(str(copy))
    stable_models.check_checkpoint(str(copy), require_auto_map=False)  # loading with the package is still fine


def test_a_folder_from_an_older_release_verifies_as_that_release(classifier, tmp_path, capsys):
    """The code files 0.1.0 wrote for a Qwen2 classifier (from this repository's history, kept as a fixture)."""
    folder, _ = classifier
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    for code in old.glob("*.py"):
        code.unlink()
    for code in (FIXTURES / "release-0.1.0").glob("*.py"):
        shutil.copy(code, old / code.name)
    config = json.loads((old / "config.json").read_text())
    for key in ("stable_models_version", "stable_models_code_sha256"):
        config.pop(key)  # 0.1.0 recorded neither
    config["auto_map"] = {
        "AutoModelForSequenceClassification": "modeling_stable_qwen2.StableQwen2ForSequenceClassification"
    }
    (old / "config.json").write_text(json.dumps(config))
    assert cli.main(["verify", str(old)]) == 0
    out = capsys.readouterr().out
    assert "modeling_stable_qwen2.py: matches (0.1.0)" in out and "stable_models 0.1.0's" in out
    assert verify_folder(old).version == "0.1.0"


def test_the_shipped_hashes_match_their_release():
    """A released version's code never changes; the installed version, once recorded, is what it recorded."""
    manifest = json.loads(MANIFEST.read_text())
    old = manifest["0.1.0"]
    for code in (FIXTURES / "release-0.1.0").glob("*.py"):
        assert old[code.name] == __import__("hashlib").sha256(code.read_bytes()).hexdigest()
    if CODE_VERSION in manifest:
        assert manifest[CODE_VERSION] == installed_code(), "code changed after its release: bump the version"


def test_the_model_card_says_both_ways_and_links_nothing_that_does_not_exist(classifier):
    folder, _ = classifier
    card = (folder / "README.md").read_text()
    assert "stable_models.from_pretrained(" in card and "trust_remote_code=True" in card
    assert "stable-models verify" in card and "revision=" in card
    assert "http" not in card  # the package is not on PyPI; the card links nowhere rather than to a dead page


def test_the_stock_architecture_is_named_for_a_plain_transformers_load(classifier):
    folder, _ = classifier
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [BY_NAME["qwen2"].stock_class.__name__]
