"""Real-checkpoint tier, SmolLM2-135M-Instruct (llama, pad == eos): the stock failure modes users hit, through
transformers' Trainer, beside the Stable result. `./dev real` (marker `real`)."""

import json

import pytest
import torch
from test_real_checkpoints import CACHE, FETCH, FINETUNE
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

import stable_models

pytestmark = pytest.mark.real
NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2():
    folder = FETCH.fetch_checkpoint(NAME, CACHE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # as SmolLM2 ships
    return folder, tokenizer


def build(kind, folder, tokenizer, dtype, lora):
    torch.manual_seed(0)
    kwargs = dict(num_labels=2, dtype=dtype)
    if kind == "stable":
        model = stable_models.from_pretrained(folder, **kwargs)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(folder, **kwargs)
    model.config.pad_token_id = tokenizer.pad_token_id
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=16, lora_alpha=32, target_modules=targets))
    return model


def encoded(rows, tokenizer):
    """Chat-style texts that end in eos (== pad), as SFT-formatted data does."""
    return [
        {**tokenizer(r["text"] + tokenizer.eos_token, truncation=True, max_length=96), "labels": r["label"]}
        for r in rows
    ]


def pooled_positions(model, batch):
    """Which position each class reads: Stable the last real token (the mask), stock the last non-pad id."""
    positions = torch.arange(batch["input_ids"].shape[1])
    if type(model.get_base_model() if hasattr(model, "get_base_model") else model).__name__.startswith("Stable"):
        return (batch["attention_mask"] * positions).argmax(-1)
    return ((batch["input_ids"] != model.config.pad_token_id) * positions).argmax(-1)


def test_pad_equal_to_eos_classifier_through_trainer(smollm2, tmp_path):
    folder, tokenizer = smollm2
    data = FETCH.fetch_data(CACHE)
    train_rows, test_rows = FINETUNE.load_split(data, held_out=500, seed=0)
    train_set, test_set = encoded(train_rows[: 150 * 16], tokenizer), encoded(test_rows, tokenizer)
    collate = DataCollatorWithPadding(tokenizer)
    table = {}
    for kind in ("stable", "stock"):
        model = build(kind, folder, tokenizer, torch.bfloat16, lora=True)
        args = TrainingArguments(
            str(tmp_path / kind), max_steps=150, per_device_train_batch_size=16, learning_rate=3e-4,
            warmup_steps=10, lr_scheduler_type="linear", logging_steps=10, report_to=[], use_cpu=True,
            save_strategy="no", seed=0, remove_unused_columns=False,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collate)
        trainer.train()
        model.eval()
        correct, off_by = 0, []
        with torch.no_grad():
            for start in range(0, len(test_set), 32):
                batch = collate(test_set[start : start + 32])
                labels = batch.pop("labels")
                correct += (model(**batch).logits.float().argmax(-1) == labels).sum().item()
                # the last real token: the eos each text ends with
                real_last = (batch["attention_mask"] * torch.arange(batch["input_ids"].shape[1])).argmax(-1)
                off_by += (real_last - pooled_positions(model, batch)).tolist()
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        table[kind] = {
            "accuracy": correct / len(test_set),
            "texts pooled at their eos": sum(o == 0 for o in off_by) / len(off_by),
            "pooled token before the eos": sum(o == 1 for o in off_by) / len(off_by),
            "last logged loss": losses[-1],
        }
        print(NAME, kind, json.dumps(table[kind]))
    assert table["stable"]["texts pooled at their eos"] == 1.0
    assert table["stock"]["pooled token before the eos"] == 1.0  # every text: the eos never reaches the head
    assert table["stable"]["accuracy"] >= 0.70  # it learns (both do; the difference is which token is read)


def one_step(kind, folder, tokenizer, examples, batch, accumulation, out):
    model = build(kind, folder, tokenizer, torch.float32, lora=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TrainingArguments(
        str(out), max_steps=1, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        learning_rate=1e-3, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, remove_unused_columns=False,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    update = torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()])
    return update, next(e["loss"] for e in trainer.state.log_history if "loss" in e)


def test_gradient_accumulation_16_vs_4x4(smollm2, tmp_path):
    folder, tokenizer = smollm2
    rows = [json.loads(line) for line in open(FETCH.fetch_data(CACHE))][:16]
    examples = encoded(rows, tokenizer)
    ratios = {}
    for kind in ("stable", "stock"):
        big, big_loss = one_step(kind, folder, tokenizer, examples, 16, 1, tmp_path / f"{kind}-16")
        small, small_loss = one_step(kind, folder, tokenizer, examples, 4, 4, tmp_path / f"{kind}-4x4")
        ratios[kind] = {"update": (small.norm() / big.norm()).item(), "logged loss": small_loss / big_loss}
        print(NAME, kind, "4x4 / 16:", json.dumps(ratios[kind]))
    assert ratios["stable"]["update"] == pytest.approx(1.0, rel=1e-2)
    assert ratios["stable"]["logged loss"] == pytest.approx(1.0, rel=1e-2)
    assert ratios["stock"]["update"] == pytest.approx(4.0, rel=2e-2)
    assert ratios["stock"]["logged loss"] == pytest.approx(4.0, rel=2e-2)
