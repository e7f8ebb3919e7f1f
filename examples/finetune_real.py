"""LoRA bf16 fine-tune of a real checkpoint on Rotten Tomatoes (fresh vs rotten), Stable vs stock, on CPU.

    python scripts/fetch_real_checkpoints.py                  # once: weights and data into ~/.cache/stable_models
    python examples/finetune_real.py --model qwen2.5-0.5b      # both classes, same seed and settings
    python examples/finetune_real.py --classes stable --save out/qwen-rt

Prints one line per evaluation and a JSON summary per class: held-out accuracy, the loss at every step (the run
stops at the first non-finite loss or gradient norm), wall time. `--save` writes the merged Stable model, which
loads back with AutoModelForSequenceClassification.from_pretrained(dir, trust_remote_code=True).
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

import stable_models

CACHE = Path(os.environ.get("STABLE_MODELS_CACHE", Path.home() / ".cache" / "stable_models"))


def load_split(path: Path, held_out: int, seed: int):
    rows = [json.loads(line) for line in open(path)]
    random.Random(seed).shuffle(rows)
    return rows[held_out:], rows[:held_out]


def build(kind: str, folder: Path, seed: int, dtype=torch.bfloat16, lora=True):
    """The Stable or stock classifier of a checkpoint with the tokenizer's pad id, LoRA r=16 on q/k/v/o unless
    `lora=False` (a full fine-tune)."""
    torch.manual_seed(seed)
    kwargs = dict(num_labels=2, dtype=dtype)
    if kind == "stable":
        model = stable_models.from_pretrained(folder, **kwargs)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(folder, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.config.pad_token_id = tokenizer.pad_token_id
    if not lora:
        return model, tokenizer
    config = LoraConfig(
        task_type="SEQ_CLS", r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    return get_peft_model(model, config), tokenizer


@torch.no_grad()
def bf16_slowdown(size=512):
    """How many times slower a bf16 matmul is than fp32 here: ~1-2x with AVX512-BF16/AMX, ~90x on an AVX2-only CPU,
    where the bf16 run takes hours instead of minutes."""
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        a @ b
        start = time.perf_counter()
        for _ in range(3):
            a @ b
        seconds[dtype] = time.perf_counter() - start
    return seconds[torch.bfloat16] / seconds[torch.float32]


@torch.no_grad()
def accuracy(model, tokenizer, rows, batch_size=32):
    model.eval()
    correct = 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = tokenizer([r["text"] for r in chunk], padding=True, truncation=True, max_length=96, return_tensors="pt")
        predictions = model(**batch).logits.float().argmax(-1)
        correct += (predictions == torch.tensor([r["label"] for r in chunk])).sum().item()
    model.train()
    return correct / len(rows)


def train(kind, folder, train_rows, test_rows, steps, batch_size, lr, seed, eval_every, log=print):
    model, tokenizer = build(kind, folder, seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10) * (1 - s / steps))
    order = random.Random(seed).sample(range(len(train_rows)), len(train_rows))
    losses, evaluations, start, finite = [], [], time.perf_counter(), True
    model.train()
    for step in range(steps):
        rows = [train_rows[order[(step * batch_size + i) % len(order)]] for i in range(batch_size)]
        batch = tokenizer([r["text"] for r in rows], padding=True, truncation=True, max_length=96, return_tensors="pt")
        loss = model(**batch, labels=torch.tensor([r["label"] for r in rows])).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        losses.append(loss.item())
        if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
            finite = False
            log(f"{kind}: step {step}: loss {loss.item()} grad norm {grad_norm.item()}: stopping")
            break
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            evaluations.append((step + 1, accuracy(model, tokenizer, test_rows)))
            log(
                f"{kind}: step {step + 1}/{steps} loss {sum(losses[-eval_every:]) / len(losses[-eval_every:]):.4f} "
                f"({loss.dtype}) held-out accuracy {evaluations[-1][1]:.1%} [{time.perf_counter() - start:.0f}s]"
            )
    summary = {
        "class": kind,
        "model_type": AutoConfig.from_pretrained(folder).model_type,
        "steps": len(losses),
        "finite": finite,
        "losses": losses,
        "evaluations": evaluations,
        "accuracy": evaluations[-1][1] if evaluations else float("nan"),
        "seconds": time.perf_counter() - start,
    }
    return model, tokenizer, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--classes", nargs="+", default=["stable", "stock"], choices=["stable", "stock"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--held-out", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, help="write the merged Stable model here")
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    folder, data = args.cache / "models" / args.model, args.cache / "data" / "rotten_tomatoes.jsonl"
    if not (folder / "config.json").is_file() or not data.is_file():
        sys.exit(f"{folder} or {data} is missing: run python scripts/fetch_real_checkpoints.py first")
    slowdown = bf16_slowdown()
    if slowdown > 10:
        print(f"warning: bf16 matmuls are {slowdown:.0f}x slower than fp32 on this CPU (no bf16 instructions): "
              "expect hours, not minutes", file=sys.stderr, flush=True)  # fmt: skip
    train_rows, test_rows = load_split(data, args.held_out, args.seed)
    for kind in args.classes:
        model, tokenizer, summary = train(
            kind, folder, train_rows, test_rows, args.steps, args.batch_size, args.lr, args.seed, args.eval_every
        )
        print(json.dumps({k: v for k, v in summary.items() if k != "losses"}), flush=True)
        if args.save and kind == "stable":
            merged = model.merge_and_unload()
            merged.save_pretrained(args.save)
            tokenizer.save_pretrained(args.save)


if __name__ == "__main__":
    main()
