"""Real-checkpoint tier, SmolLM2-135M-Instruct (llama, pad == eos as it ships): the stock failure modes users hit,
through transformers' Trainer, beside the Stable result. `./dev real -k smollm2` (marker `real`).

fp32 LoRA: the failures shown here (which token is pooled, the accumulation scale) do not depend on the dtype, and
on a CPU without bf16 instructions (AVX2 only) a bf16 matmul is ~90x slower than fp32 (3.7 s vs ~90 s a step here).
Each test prints a markdown table (the README's) with `-s`.
"""

import json
import time

import pytest
import torch
from test_real_checkpoints import CACHE, FETCH, FINETUNE
from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

pytestmark = pytest.mark.real
NAME = "smollm2-135m"
STEPS, BATCH = 100, 16


@pytest.fixture(scope="module")
def smollm2():
    folder = FETCH.fetch_checkpoint(NAME, CACHE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # as SmolLM2 ships
    return folder, tokenizer


def encoded(rows, tokenizer):
    """Texts that end in eos (== pad), as chat- and SFT-formatted data does."""
    return [
        {**tokenizer(r["text"] + tokenizer.eos_token, truncation=True, max_length=96), "labels": r["label"]}
        for r in rows
    ]


def arguments(out, **overrides):
    settings = dict(
        report_to=[], use_cpu=True, save_strategy="no", seed=0, remove_unused_columns=False, disable_tqdm=True
    )
    return TrainingArguments(str(out), **{**settings, **overrides})


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


@torch.no_grad()
def evaluate(model, batches):
    """Accuracy of the model's own forward, and of the head read at the last real token (the eos each text ends
    with): what a last-token pooler that follows the mask reads, as vLLM's classify does. Also which token the
    forward pooled, and how far its logits are from the head's at the last real token."""
    model.eval()
    head = model.get_base_model().score if hasattr(model, "get_base_model") else model.score
    own = at_eos = 0
    pooled_eos, gaps, count = 0, [], 0
    for batch in batches:
        labels = batch.pop("labels")
        out = model(**batch, output_hidden_states=True)
        last_real = (batch["attention_mask"] * torch.arange(batch["input_ids"].shape[1])).argmax(-1)
        eos_logits = head(out.hidden_states[-1][torch.arange(len(labels)), last_real]).float()
        logits = out.logits.float()
        own += (logits.argmax(-1) == labels).sum().item()
        at_eos += (eos_logits.argmax(-1) == labels).sum().item()
        gap = (logits - eos_logits).abs().amax(-1)
        pooled_eos += (gap <= 1e-4).sum().item()
        gaps.append(gap.max().item())
        count += len(labels)
    model.train()
    return {"accuracy": own / count, "at_eos": at_eos / count, "pooled_eos": pooled_eos / count, "gap": max(gaps)}


def test_pad_equal_to_eos_classifier_through_trainer(smollm2, tmp_path):
    folder, tokenizer = smollm2
    train_rows, test_rows = FINETUNE.load_split(FETCH.fetch_data(CACHE), held_out=500, seed=0)
    train_set, test_set = encoded(train_rows[: STEPS * BATCH], tokenizer), encoded(test_rows, tokenizer)
    collate = DataCollatorWithPadding(tokenizer)
    results = {}
    for kind in ("stock", "stable"):
        model, _ = FINETUNE.build(kind, folder, seed=0, dtype=torch.float32)
        args = arguments(
            tmp_path / kind, max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=3e-4,
            warmup_steps=10, lr_scheduler_type="linear", logging_steps=10,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collate)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        batches = [collate(test_set[i : i + 32]) for i in range(0, len(test_set), 32)]
        results[kind] = {**evaluate(model, batches), "seconds": seconds}
        print(NAME, kind, json.dumps(results[kind]), flush=True)
    header = ["class", "held-out accuracy", "read at the last real token (eos)", "texts pooled at their eos"]
    header += ["max pooled-token error (logits)", "train time"]
    cells = "{accuracy:.1%} {at_eos:.1%} {pooled_eos:.0%} {gap:.2f} {seconds:.0f}s"
    print("\n" + table(header, [[kind, *cells.format(**r).split()] for kind, r in results.items()]))
    stable, stock = results["stable"], results["stock"]
    assert stable["pooled_eos"] == 1.0 and stable["gap"] <= 1e-4  # Stable reads the eos each text ends with
    assert stable["accuracy"] == stable["at_eos"]  # so a mask-following server reads what it was trained on
    assert stable["accuracy"] >= 0.70  # it learns
    assert stock["pooled_eos"] == 0.0  # stock skips the eos == pad on every text and reads the token before it
    assert stock["gap"] > 1.0  # its logits are not the head's at the text's last token
    # the stock head learned the token before eos: read where each text ends (as a mask-following server reads it)
    # it is at chance on these balanced labels (measured 48.0 %; 0.60 is 4.5 standard errors above 50 % at n = 500)
    assert stock["at_eos"] < 0.60


def one_step(kind, folder, tokenizer, examples, batch, accumulation, out):
    """One optimizer step of plain SGD over the same 16 examples: the update is lr x the gradient Trainer built."""
    model, _ = FINETUNE.build(kind, folder, seed=0, dtype=torch.float32, lora=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = arguments(
        out, max_steps=1, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        learning_rate=1e-3, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    update = torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()])
    return update, next(e["loss"] for e in trainer.state.log_history if "loss" in e)


def test_gradient_accumulation_16_vs_4x4(smollm2, tmp_path):
    folder, tokenizer = smollm2
    rows = [json.loads(line) for line in open(FETCH.fetch_data(CACHE))][:16]
    examples = encoded(rows, tokenizer)
    ratios, rows_out = {}, []
    for kind in ("stock", "stable"):
        big, big_loss = one_step(kind, folder, tokenizer, examples, 16, 1, tmp_path / f"{kind}-16")
        small, small_loss = one_step(kind, folder, tokenizer, examples, 4, 4, tmp_path / f"{kind}-4x4")
        ratios[kind] = {"update": (small.norm() / big.norm()).item(), "logged loss": small_loss / big_loss}
        rows_out.append(
            [kind, f"{big_loss:.4f}", f"{small_loss:.4f}", f"{ratios[kind]['logged loss']:.3f}",
             f"{big.norm():.4g}", f"{small.norm():.4g}", f"{ratios[kind]['update']:.3f}"]
        )  # fmt: skip
        print(NAME, kind, "4x4 / 16:", json.dumps(ratios[kind]), flush=True)
    header = ["class", "logged loss 16", "logged loss 4x4", "ratio", "update norm 16", "update norm 4x4", "ratio"]
    print("\n" + table(header, rows_out))
    assert ratios["stable"]["update"] == pytest.approx(1.0, rel=1e-2)
    assert ratios["stable"]["logged loss"] == pytest.approx(1.0, rel=1e-2)
    assert ratios["stock"]["update"] == pytest.approx(4.0, rel=2e-2)
    assert ratios["stock"]["logged loss"] == pytest.approx(4.0, rel=2e-2)


def test_cli_trains_from_the_gguf_file_itself(smollm2, tmp_path):
    """`stable-models train --model DIR --gguf-file NAME.gguf`: the quantized file dequantized on load, trained, saved
    as a plain checkpoint (no GGUF quantization settings) that loads without the library's help."""
    from transformers import AutoModelForSequenceClassification

    from stable_models import cli

    gguf = CACHE / "gguf" / NAME / f"{NAME}.gguf"
    rows = [json.loads(line) for line in open(FETCH.fetch_data(CACHE))][:40]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", "--model", gguf.parent, "--gguf-file", gguf.name, "--train", tmp_path / "train.jsonl"]
    argv += ["--output", tmp_path / "out", "--max-steps", "2", "--eval-steps", "2", "--batch-size", "4"]
    assert cli.main([str(a) for a in argv]) == 0
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in saved and saved["model_type"] == "llama"
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", trust_remote_code=True)
    assert type(model).__name__ == "StableLlamaForSequenceClassification"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert torch.isfinite(model(**tokenizer(rows[0]["text"], return_tensors="pt")).logits).all()
