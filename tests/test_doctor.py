"""`python -m stable_models doctor` end to end on tiny checkpoints saved by the test, with tokenizers built here."""

import json
import subprocess
import sys

import pytest
import torch
from architectures import BY_NAME, make_config
from tiny_tokenizers import gemma_like, llama_pad_is_eos, qwen2_like


def save_checkpoint(folder, arch_name, tokenizer, poison=False):
    arch = BY_NAME[arch_name]
    torch.manual_seed(0)
    config = make_config(
        arch, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
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


def doctor(*args):
    result = subprocess.run(
        [sys.executable, "-m", "stable_models", "doctor", *map(str, args)], capture_output=True, text=True, timeout=300
    )
    return result.returncode, result.stdout, result.stderr


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


def test_empty_texts_are_named(tmp_path):
    folder = save_checkpoint(tmp_path / "model", "qwen2", qwen2_like())
    data = write_data(tmp_path / "data.jsonl", ["the film", "", "bad"])
    code, out, err = doctor("--model", folder, "--data", data, "--dtype", "fp32")
    assert code == 1
    assert "rows [1] of attention_mask are all zero" in out
