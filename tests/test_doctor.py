"""`python -m stable_models doctor` end to end on tiny checkpoints saved by the test, with tokenizers built here."""

import contextlib
import io
import json
import re
import subprocess
import sys
import warnings

import pytest
import torch
from architectures import BY_NAME, make_config
from tiny_tokenizers import gemma_like, llama_pad_is_eos, qwen2_like

from stable_models import cli

QLORA_SIZES = {"hidden_size": 64, "intermediate_size": 128}  # bitsandbytes packs 64-wide rows


def save_checkpoint(folder, arch_name, tokenizer, poison=False, **overrides):
    """A tiny random causal LM of the architecture and its tokenizer; `overrides` change its config."""
    arch = BY_NAME[arch_name]
    torch.manual_seed(0)
    config = make_config(
        arch,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **overrides,
    )
    model = arch.causal_lm_class(config)
    if poison:
        with torch.no_grad():
            model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TEXTS = [
    "the film was great",
    "bad",
    "a very dull plot but good actor",
    "i loved it",
    "not good and not bad",
    "the movie is fine",
    "awful",
    "the actor was very good but the plot was dull",
]


def write_data(path, texts=TEXTS):
    path.write_text("".join(json.dumps({"text": t, "label": i % 3}) + "\n" for i, t in enumerate(texts)))
    return path


def run_main(main, argv):
    """A command's `main(argv)` in this process (a fresh interpreter costs ~10 s of imports per call):
    (exit code, stdout, stderr). The package's own `--help` test below runs it as a subprocess."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")  # as a fresh interpreter shows them: each once per run
        try:
            code = main(argv)
        except SystemExit as exit:  # argparse: --help, usage errors
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return code, out.getvalue(), err.getvalue()


def doctor(*args):
    """`python -m stable_models doctor ARGS`."""
    return run_main(cli.main, ["doctor", *map(str, args)])


@pytest.mark.parametrize(("arch", "tokenizer", "side"), [("qwen2", qwen2_like, "left"), ("gemma2", gemma_like, None)])
def test_healthy_checkpoint(tmp_path, arch, tokenizer, side):
    folder = save_checkpoint(tmp_path / "model", arch, tokenizer())
    data = write_data(tmp_path / "data.jsonl")
    args = ["--model", folder, "--data", data, "--dtype", "fp32"] + (["--padding-side", side] if side else [])
    code, out, err = doctor(*args)
    assert code == 0, out + err
    assert "Stable class: healthy" in out
    assert "ok    Stable: loss, logits and gradients are finite" in out
    assert "stock class: the loss ignores num_items_in_batch" in out
    assert "[doctor]" in err  # progress


def test_pad_equal_to_eos_and_bf16_are_reported(tmp_path):
    folder = save_checkpoint(tmp_path / "model", "llama", llama_pad_is_eos())
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"text": t, "label": i % 3}) + "\n"
            for i, t in enumerate(["the film was great", "bad", "a very dull plot but good actor"])
        )
    )
    code, out, err = doctor("--model", folder, "--data", data, "--dtype", "bf16", "--padding-side", "right")
    assert code == 0, out + err
    assert "pad == eos" in out
    assert "stock class: loss computed in torch.bfloat16" in out
    assert "without fp32" in out and "master weights" in out
    assert "3 texts" in out


def test_non_finite_checkpoint_fails_and_names_the_module(tmp_path):
    folder = save_checkpoint(tmp_path / "model", "qwen2", qwen2_like(), poison=True)
    code, out, err = doctor("--model", folder, "--data", write_data(tmp_path / "data.jsonl"), "--dtype", "fp32")
    assert code == 1, out + err
    assert "FAIL  Stable: non-finite values, first at model.layers.1.mlp.up_proj" in out
    assert "the checkpoint holds NaN/inf in ['model.layers.1.mlp.up_proj.weight']" in out
    assert "Stable class: 1 problem(s)" in out


def test_empty_texts_are_a_data_problem_and_the_run_goes_on(tmp_path):
    folder = save_checkpoint(tmp_path / "model", "qwen2", qwen2_like())
    data = write_data(tmp_path / "data.jsonl", ["the film", "", "bad", "   ", "i loved it"])
    code, out, err = doctor("--model", folder, "--data", data, "--dtype", "fp32")
    assert code == 0, out + err
    assert "2 text(s) are empty or tokenize to nothing (data lines [2, 4]): left out" in out
    assert "3 texts" in out and "Stable class: healthy" in out
    assert "RuntimeError" not in out and "FAIL" not in out


def test_string_labels_are_mapped_and_the_map_is_printed(tmp_path):
    folder = save_checkpoint(tmp_path / "model", "qwen2", qwen2_like())
    data = tmp_path / "data.jsonl"
    labels = ["积极", "消极", "中立", "积极"]
    data.write_text(
        "".join(
            json.dumps({"text": t, "label": y}, ensure_ascii=False) + "\n" for t, y in zip(TEXTS, labels, strict=False)
        )
    )
    code, out, err = doctor("--model", folder, "--data", data, "--dtype", "fp32")
    assert code == 0, out + err
    assert "labels mapped to ids: '中立' -> 0, '消极' -> 1, '积极' -> 2" in out
    assert "too many dimensions" not in out + err


def test_table_keeps_exponents(tmp_path):
    folder = save_checkpoint(tmp_path / "model", "qwen2", qwen2_like())
    code, out, err = doctor("--model", folder, "--data", write_data(tmp_path / "data.jsonl"), "--dtype", "fp32")
    row = next(line for line in out.splitlines() if line.strip().startswith("padding error"))
    stable_cell = row.split()[-1]
    assert re.fullmatch(r"\d(\.\d+)?e-\d\d|0", stable_cell), row  # e.g. 5.96046e-08, not 5.960464477539


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [{"sentence": "the film", "label": 0}],
            r"no column 'text' \(columns: sentence, label\); pass --text-key",
        ),
        (
            [{"text": "the film", "label": 0}, {"text": "bad"}],
            r"'label' is missing or NaN in 1 row\(s\), first at row 2",
        ),
    ],
    ids=["wrong-key", "some-labels"],
)
def test_bad_data_files_get_one_line_errors(tmp_path, lines, message):
    folder = save_checkpoint(tmp_path / "model", "qwen2", qwen2_like())
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out, err = doctor("--model", folder, "--data", data)
    assert code == 2 and re.search(message, err), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_folder_gets_a_one_line_error(tmp_path):
    code, out, err = doctor("--model", tmp_path / "nowhere")
    assert code == 2 and "not a folder with a config.json" in err and "Traceback" not in err


def test_help_shows_defaults_and_the_package_help_exits_0():
    code, out, err = doctor("--help")
    assert code == 0 and "(default: bf16)" in out and "--log" in out
    result = subprocess.run([sys.executable, "-m", "stable_models", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and all(word in result.stdout for word in ("train", "evaluate", "predict", "doctor"))
