"""Contract point 8 for class-level questions: whatever transformers asks of a model *class* (experts and attention
kernels it may set, custom-code loading, support flags) a Stable class answers as its stock class does, asked first or
second, in a fresh interpreter; and the loading path that follows from it initialises missing weights as stock does."""

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from architectures import BY_NAME, FIRST_CLASS, make_config
from safetensors.torch import load_file, save_file

from stable_models.modeling_stable import STOCK_CLASS_QUESTIONS

# The class questions the core hands to the stock class (read from the defining module or `_auto_class`), plus the
# support flags, which the Stable classes inherit.
QUESTIONS = STOCK_CLASS_QUESTIONS
FLAGS = (
    "_supports_sdpa",
    "_supports_flash_attn",
    "_supports_flex_attn",
    "_supports_attention_backend",
    "_can_compile_fullgraph",
    "supports_gradient_checkpointing",
    "_no_split_modules",
    "_tp_plan",
    "_pp_plan",
    "base_model_prefix",
    "main_input_name",
)
# Every Mixture-of-Experts type of the table (transformers 5.24 lets them choose grouped_mm experts kernels).
MOE = [
    n
    for n in (
        "axk1 axk2 deepseek_v2 deepseek_v3 gpt_oss hunyuan_v1_moe jamba minimax mistral4 mixtral phimoe qwen2_moe "
        "qwen3_moe qwen3_next"
    ).split()
    if n in BY_NAME
]
TYPES = sorted(set(MOE) | {arch.name for arch in FIRST_CLASS})

ASK = """
import json, sys
sys.path.insert(0, {tests!r})
from architectures import BY_NAME
order, names = sys.argv[1], sys.argv[2:]
questions, flags = {questions!r}, {flags!r}

def answers(cls):
    found = {{q: getattr(cls, q)() for q in questions if hasattr(cls, q)}}
    found.update({{f: repr(getattr(cls, f, None)) for f in flags}})
    return found

result = {{}}
for name in names:
    arch = BY_NAME[name]
    pair = [("stable", arch.stable_class), ("stock", arch.stock_class)]
    result[name] = {{who: answers(cls) for who, cls in (pair if order == "stable-first" else pair[::-1])}}
print(json.dumps(result))
"""


def ask_fresh(order: str, names: list[str]) -> dict:
    script = ASK.format(tests=os.path.dirname(__file__), questions=QUESTIONS, flags=FLAGS)
    run = subprocess.run([sys.executable, "-c", script, order, *names], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["stable-first", "stock-first"])
def test_class_questions_get_the_stock_answer_in_a_fresh_interpreter(order):
    answers = ask_fresh(order, TYPES)
    for name in TYPES:
        assert answers[name]["stable"] == answers[name]["stock"], name
    if "_can_set_experts_implementation" in answers["llama"]["stock"]:  # transformers >= 5: the questions were asked
        assert answers["mixtral"]["stable"]["_can_set_experts_implementation"] is True
        assert answers["llama"]["stable"]["_can_set_experts_implementation"] is False
        assert answers["llama"]["stable"]["is_custom_code"] is False
    assert answers["llama"]["stable"]["_can_set_attn_implementation"] is True


GROUPED = """
import os, sys, torch
sys.path.insert(0, {tests!r})
from architectures import BY_NAME, make_config
for name in sys.argv[2:]:
    arch = BY_NAME[name]
    model = arch.stable_class(make_config(arch))  # the Stable class asks first in this interpreter
    model.set_experts_implementation("grouped_mm")
    assert model.config._experts_implementation == "grouped_mm", model.config._experts_implementation
    folder = os.path.join(sys.argv[1], name)
    model.save_pretrained(folder)
    loaded = arch.stable_class.from_pretrained(folder, experts_implementation="grouped_mm")
    assert loaded.config._experts_implementation == "grouped_mm"
    stock = arch.stock_class.from_pretrained(folder, experts_implementation="grouped_mm")
    ids = torch.randint(3, 90, (2, 6))
    with torch.no_grad():
        print(name, (loaded(ids).logits - stock(ids).logits).abs().max().item())
"""


@pytest.mark.skipif(
    not hasattr(transformers.PreTrainedModel, "set_experts_implementation"),
    reason="this transformers release has no experts kernels to choose (transformers 5 added them)",
)
def test_grouped_experts_can_be_chosen_when_the_stable_class_asks_first(tmp_path):
    names = [n for n in ("mixtral", "qwen3_moe", "deepseek_v3") if n in BY_NAME]
    for name in names:
        if not BY_NAME[name].stock_class._can_set_experts_implementation():
            pytest.fail(f"the stock {name} class no longer offers grouped_mm: update this test")
    script = GROUPED.format(tests=os.path.dirname(__file__))
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), *names], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    differences = dict(line.split() for line in run.stdout.strip().splitlines()[-len(names) :])
    assert sorted(differences) == sorted(names)
    assert all(float(d) <= 1e-5 for d in differences.values()), differences


def drop_and_load(arch, tmp_path, is_dropped):
    """Save a stock checkpoint without the weights `is_dropped` picks, load it with both classes under one seed."""
    torch.manual_seed(0)
    arch.stock_class(make_config(arch)).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    dropped = sorted(k for k in weights if is_dropped(k))
    assert dropped, "nothing to drop: the test would prove nothing"
    save_file({k: v for k, v in weights.items() if k not in dropped}, tmp_path / "model.safetensors", {"format": "pt"})
    loaded, missing = {}, {}
    for cls in (arch.stable_class, arch.stock_class):
        torch.manual_seed(1)
        model, info = cls.from_pretrained(tmp_path, output_loading_info=True)
        loaded[cls], missing[cls] = dict(model.named_parameters()), set(info["missing_keys"])
    assert missing[arch.stable_class] == missing[arch.stock_class] and len(missing[arch.stock_class]) == len(dropped)
    return sorted(missing[arch.stock_class]), loaded[arch.stable_class], loaded[arch.stock_class]


@pytest.mark.parametrize(
    ("name", "part"),
    [("qwen3_next", "mlp.gate.weight"), ("mixtral", "moe.gate.weight"), ("gemma3", "vision_tower.encoder.layers.0.")],
)
def test_weights_missing_from_a_checkpoint_are_initialised_as_the_stock_class_does(name, part, tmp_path):
    """A checkpoint without its router (or a vision layer): the Stable class used to leave it as raw memory
    (custom-code loading; qwen3_next gave non-finite logits). Same seed, same values as the stock class."""
    if name not in BY_NAME:
        pytest.skip(f"{name} is not in this transformers release")
    dropped, stable, stock = drop_and_load(BY_NAME[name], tmp_path, lambda key: part in key)
    for key in dropped:
        assert torch.isfinite(stable[key]).all() and stable[key].abs().max() < 10, key
        assert torch.equal(stable[key], stock[key]), key
