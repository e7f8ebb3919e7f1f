"""Quickstart: LoRA fine-tuning of tiny Gemma2 and Qwen2 classifiers in bf16, Stable vs stock, side by side.

Both classes start from the same random weights and see the same padded batches (left and right padding, texts
that end with eos, sliding windows shorter than the padding). For each run it prints the final training loss
and its dtype, the last gradient norm, the padding-invariance error (max |logit| difference between a padded
batch and each text run alone) and held-out accuracy.

    ./dev quickstart                 # defaults: both architectures, left padding
    ./dev quickstart --side left right  # both padding sides
    ./dev quickstart --steps 200     # longer runs
    ./dev quickstart --real          # the real Qwen2.5-0.5B on Rotten Tomatoes instead (examples/finetune_real.py)
"""

import argparse
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import Gemma2Config, Gemma2ForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

from stable_models import StableGemma2ForSequenceClassification, StableQwen2ForSequenceClassification

VOCAB, PAD, EOS, FIRST_WORD, LABEL_WORDS = 128, 0, 1, 3, 15
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=PAD,
    eos_token_id=EOS,
    bos_token_id=2,
    num_labels=3,
)
ARCHITECTURES = {
    "gemma2": (
        Gemma2Config(**TINY, head_dim=16, query_pre_attn_scalar=16, sliding_window=4, attn_implementation="eager"),
        Gemma2ForSequenceClassification,
        StableGemma2ForSequenceClassification,
    ),
    "qwen2": (
        Qwen2Config(**TINY, use_sliding_window=True, sliding_window=4, max_window_layers=1, attn_implementation="sdpa"),
        Qwen2ForSequenceClassification,
        StableQwen2ForSequenceClassification,
    ),
}


def make_texts(count, seed):
    """Random words, then one of 15 label words (5 per class) and eos: the label is the class of that word."""
    generator = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for _ in range(count):
        length = int(torch.randint(3, 16, (1,), generator=generator))
        words = torch.randint(FIRST_WORD + LABEL_WORDS, VOCAB, (length,), generator=generator)
        label_word = int(torch.randint(0, LABEL_WORDS, (1,), generator=generator))
        texts.append(torch.cat([words, torch.tensor([FIRST_WORD + label_word, EOS])]))
        labels.append(label_word % 3)
    return texts, torch.tensor(labels)


def pad(texts, side):
    width = max(len(t) for t in texts)
    ids = torch.full((len(texts), width), PAD)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row, text in enumerate(texts):
        span = slice(width - len(text), width) if side == "left" else slice(0, len(text))
        ids[row, span], mask[row, span] = text, 1
    return ids, mask


def build(config, model_class, seed):
    torch.manual_seed(seed)
    model = model_class(config).to(torch.bfloat16)
    lora = LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return get_peft_model(model, lora)


def train_and_measure(model, train, test, side, steps, batch_size, lr):
    texts, labels = train
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses, grad_norm, loss_dtype = [], float("nan"), None
    for step in range(steps):
        rows = torch.arange(step * batch_size, (step + 1) * batch_size) % len(texts)
        ids, mask = pad([texts[i] for i in rows], side)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels[rows]).loss
        loss.backward()
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        loss_dtype = loss.dtype
    model.eval()
    test_texts, test_labels = test
    with torch.no_grad():
        ids, mask = pad(test_texts, side)
        batched = model(input_ids=ids, attention_mask=mask).logits.float()
        alone = torch.cat(
            [model(input_ids=t[None], attention_mask=torch.ones(1, len(t))).logits.float() for t in test_texts]
        )
    return {
        "loss": sum(losses[-10:]) / min(10, len(losses)),
        "loss dtype": str(loss_dtype).replace("torch.", ""),
        "grad norm": grad_norm,
        "pad error": (batched - alone).abs().max().item(),
        "accuracy": (batched.argmax(-1) == test_labels).float().mean().item(),
    }


def main():
    # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` (peft's, not ours): keep the table clean
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=list(ARCHITECTURES), choices=list(ARCHITECTURES))
    parser.add_argument(
        "--side",
        nargs="+",
        default=["left"],
        choices=["left", "right"],
        help="padding side(s) (default: left, as Gemma pads)",
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--real",
        nargs="?",
        const="qwen2.5-0.5b",
        metavar="MODEL",
        help="fetch a real checkpoint (default qwen2.5-0.5b) and fine-tune it on Rotten Tomatoes",
    )
    args = parser.parse_args()
    if args.real:
        here = Path(__file__).resolve().parent
        subprocess.run(
            [sys.executable, str(here.parent / "scripts" / "fetch_real_checkpoints.py"), "--only", args.real, "data"],
            check=True,
        )
        sys.exit(subprocess.run([sys.executable, str(here / "finetune_real.py"), "--model", args.real]).returncode)
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    train, test = make_texts(512, args.seed), make_texts(128, args.seed + 1)

    print(
        f"{'arch':7} {'padding':7} {'class':7} {'loss':>8} {'dtype':>9} {'grad norm':>9} {'pad error':>10} "
        f"{'accuracy':>8} {'time':>6}"
    )
    for arch in args.arch:
        config, stock_class, stable_class = ARCHITECTURES[arch]
        for side in args.side:
            for name, model_class in (("stock", stock_class), ("Stable", stable_class)):
                start = time.perf_counter()
                model = build(config, model_class, args.seed)
                r = train_and_measure(model, train, test, side, args.steps, args.batch_size, args.lr)
                print(
                    f"{arch:7} {side:7} {name:7} {r['loss']:8.4f} {r['loss dtype']:>9} {r['grad norm']:9.3f} "
                    f"{r['pad error']:10.2e} {r['accuracy']:8.1%} {time.perf_counter() - start:5.1f}s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
