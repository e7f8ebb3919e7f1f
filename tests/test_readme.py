"""The python blocks of the README and of docs/ run as written, against tiny local checkpoints, so they cannot rot.

The first block is a whole program (only its path is replaced by a tiny Qwen2 folder). The others are fragments of a
user's script; each runs with the names its surrounding README text assumes (a model, TrainingArguments, a dataset, a
saved folder), and every Trainer it builds trains one step.
"""

import re

import pytest
import torch
import transformers
from architectures import BY_NAME, VOCAB, collate_left, cpu_training_args, make_config, toy_dataset
from documented import blocks
from tiny_tokenizers import llama_pad_is_eos, qwen2_like

import stable_models

# the README first: its first block is the program; a block that imports ray runs in the cluster tier (tests/cluster)
BLOCKS = [block for block in blocks("python") if "import ray\n" not in block]


def causal_lm_folder(folder, arch_name, tokenizer):
    torch.manual_seed(0)
    vocab = max(len(tokenizer), VOCAB)  # the toy datasets use ids up to VOCAB
    config = make_config(BY_NAME[arch_name], vocab_size=vocab, pad_token_id=tokenizer.pad_token_id)
    BY_NAME[arch_name].causal_lm_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def context(tmp_path):
    """What the README's fragments take as given."""
    qwen2 = causal_lm_folder(tmp_path / "qwen2", "qwen2", qwen2_like())
    stable = stable_models.StableQwen2ForSequenceClassification.from_pretrained(qwen2, num_labels=3)
    stable.save_pretrained(tmp_path / "saved")
    return {
        "torch": torch,
        "stable_models": stable_models,
        "Trainer": transformers.Trainer,
        "AutoTokenizer": transformers.AutoTokenizer,
        "AutoModelForSequenceClassification": transformers.AutoModelForSequenceClassification,
        "StableLlamaForSequenceClassification": stable_models.StableLlamaForSequenceClassification,
        "model": stable,
        "args": cpu_training_args(tmp_path / "run", max_steps=1, per_device_train_batch_size=4),
        "tokenized": toy_dataset([3, 5, 4, 6], seed=1),
        "data": toy_dataset([3, 5, 4, 6], seed=2),
        "pairs": [
            {"chosen_input_ids": a["input_ids"], "rejected_input_ids": b["input_ids"]}
            for a, b in zip(toy_dataset([3, 5, 4, 6], seed=3), toy_dataset([4, 2, 6, 3], seed=4), strict=True)
        ],
        "path": causal_lm_folder(tmp_path / "llama", "llama", llama_pad_is_eos()),
        "folder": str(tmp_path / "saved"),
        "name": qwen2,
        "qwen2": qwen2,
    }


def run_in_one_process_group(code, namespace):
    import socket

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        exec(code, namespace)
    finally:
        torch.distributed.destroy_process_group()


def test_there_are_blocks_to_run():
    assert len(BLOCKS) >= 5 and "path/to/Qwen2.5-0.5B" in BLOCKS[0]


def test_the_usage_snippet_is_a_whole_program(context):
    namespace = {}
    exec(BLOCKS[0].replace("path/to/Qwen2.5-0.5B", context["qwen2"]), namespace)  # no names given: none needed
    out = namespace["out"]
    assert out.logits.shape == (3, 3) and out.logits.dtype == out.loss.dtype == torch.float32
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("index", range(1, len(BLOCKS)))
def test_fragment_runs_with_what_the_text_gives(index, context):
    namespace = dict(context, collate_left=collate_left)
    code = BLOCKS[index]
    if "Trainer(" in code and "data_collator" not in code:
        code = code.replace("Trainer(", "Trainer(data_collator=collate_left, ", 1)  # the user's own collator
    if "fully_shard(" in code:  # FSDP2 needs a process group: one gloo process
        run_in_one_process_group(code, namespace)
        ids = torch.tensor([[5, 6, 7, 8]])
        assert namespace["model"](ids, labels=torch.tensor([1])).logits.dtype == torch.float32
        return
    exec(code, namespace)
    if re.search(r"^trainer = (Stable)?Trainer\(", code, re.M):
        namespace["trainer"].train()
        assert namespace["trainer"].state.global_step == 1
    if "model" in namespace and namespace["model"] is not context["model"]:
        assert type(namespace["model"]).__name__.startswith("Stable")
