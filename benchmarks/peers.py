"""Classifiers: `stable-models train` beside the peers a user reaches for, on the README demo's job, each in a venv of
its own, interleaved round by round:

    ./dev demo --help >/dev/null            # the demo's venv (.venv: the cli extra)
    .venv/bin/python -m benchmarks.peers    # makes .venv-peer-swift once (torch 2.13 CPU + ms-swift 4.6)
    .venv/bin/python -m benchmarks.peers --only Trainer --bf16   # ours and the Trainer script, fp32 and bf16 autocast

Where .venv already holds the test extras (./dev test), both ours and the Trainer script also import bitsandbytes and
DeepSpeed (about 2.5 s a run): `STABLE_MODELS_VENV=.venv-demo ./dev demo --help` makes a venv with the cli extra
alone, and `.venv-demo/bin/python -m benchmarks.peers ...` runs in it.

The job: SmolLM2-135M-Instruct, 320 Rotten Tomatoes reviews to train on, 100 to evaluate on during training, 300 to
test on (the demo's split); LoRA r 16 (alpha 32) on every linear layer of the decoder layers, 40 steps of 8, AdamW at
lr 1e-3 with a 5 % linear warm-up, fp32 (ours is told `--dtype fp32`: its `auto` picks bf16 autocast on CPUs with
AVX512-BF16, and the peers train in fp32), seed 0, one evaluation of the 100 at the end.

The peers:
- ms-swift 4.6, `swift sft --task_type seq_cls` (its own venv: it pins transformers < 5.20, peft < 0.21, trl < 1),
  with the reviews as one user message each, as its docs lay out seq_cls data;
- a plain transformers Trainer with peft, the steps of transformers' `run_classification.py` example (that script is
  not on PyPI, and this machine reaches only the package registries, so its steps are written out below:
  AutoModelForSequenceClassification, the eos token as pad token, Trainer, accuracy at evaluation) with LoRA added,
  which the example lacks. It runs in .venv, without importing stable_models. Twice: at the example's defaults
  (`pad_to_max_length=True`, `max_seq_length=128`: every text padded to 128 tokens, `default_data_collator`), and
  as run with `--pad_to_max_length False` (DataCollatorWithPadding: each batch padded to its longest text), the
  fastest way to run it and the row the 1.5x goal is held to.

Wall time is launch to the saved model (ours: the whole `train` command, with its pre-flight and its merge). Peak
memory is the largest resident set of the run's processes (`/usr/bin/time`). Test accuracy comes afterwards, outside
the timing, from each tool's own scoring: ours from `stable-models evaluate`, ms-swift's from `swift infer`, the
Trainer script's from `score` below (its saved adapter on the base, the texts tokenized as it trained on them).

Where a peer's defaults differ from the job, the job wins, so the runs train the same recipe: ms-swift is given
`--gradient_checkpointing false` (its default is on), no LoRA dropout (0.05; peft's default, and ours, is 0: at 0.05
peft copies every LoRA layer's input through a dropout, 20 % of ms-swift's step here), a linear schedule (cosine) and
no weight decay (0.1), and, for this local folder, `--model_type llama --template chatml --template_backend jinja`
(the model's own chat template). What stays ms-swift's own: it renders each review through that template, which
adds the model's default system prompt (56.4 tokens a review against 26.4 as plain text), and it pads each batch to
its longest row.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWIFT_VENV = ROOT / ".venv-peer-swift"
SWIFT_SPECS = ["torch==2.13.0", "ms-swift==4.6.0"]
STEPS, BATCH, LR, LORA_R, WARMUP = 40, 8, 1e-3, 16, 0.05
MAX_SEQ_LENGTH = 128  # run_classification.py's default (no review here is longer)
LABELS = ["fresh", "rotten"]
OURS = {"fp32": "stable-models train", "bf16": "stable-models train, bf16 autocast"}  # the rows each peer is held to
TRAINER_DEFAULTS = "transformers Trainer + peft, run_classification.py's defaults (every text padded to 128)"
TRAINER_DYNAMIC = "transformers Trainer + peft, --pad_to_max_length False (each batch padded to its longest)"


def train_with_trainer(args) -> None:
    """The peer: a plain transformers + peft Trainer script (what run_classification.py does, plus LoRA)."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        default_data_collator,
    )

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    label2id = {name: i for i, name in enumerate(LABELS)}
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=2, label2id=label2id, id2label=dict(enumerate(LABELS))
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    lora = LoraConfig(task_type="SEQ_CLS", r=LORA_R, lora_alpha=2 * LORA_R, target_modules="all-linear")
    model = get_peft_model(model, lora)
    data = load_dataset("json", data_files={"train": str(args.train), "dev": str(args.dev)})
    padding = False if args.dynamic_padding else "max_length"  # the example's pad_to_max_length (default True)
    data = data.map(lambda b: {**tokenizer(b["text"], padding=padding, max_length=MAX_SEQ_LENGTH, truncation=True),
                               "labels": [label2id[x] for x in b["label"]]},
                    batched=True, remove_columns=["text", "label"])  # fmt: skip
    training = TrainingArguments(
        str(args.output / "run"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        learning_rate=LR,
        warmup_steps=int(STEPS * WARMUP),
        eval_strategy="steps",
        eval_steps=STEPS,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        logging_steps=10,
        bf16=args.bf16,
    )
    collator = DataCollatorWithPadding(tokenizer) if args.dynamic_padding else default_data_collator
    accuracy = lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}  # noqa: E731
    trainer = Trainer(model, training, train_dataset=data["train"], eval_dataset=data["dev"], data_collator=collator,
                      compute_metrics=accuracy)  # fmt: skip
    trainer.train()
    model.save_pretrained(args.output / "adapter")
    tokenizer.save_pretrained(args.output / "adapter")


def score(args) -> None:
    """Test accuracy of the Trainer peer's saved LoRA classifier: the base plus the adapter, as it was trained."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.adapter)
    base = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)
    base.config.pad_token_id = tokenizer.pad_token_id
    model = PeftModel.from_pretrained(base, args.adapter).eval()
    rows = [json.loads(line) for line in args.data.open()]
    correct = 0
    for start in range(0, len(rows), 16):
        batch = rows[start : start + 16]
        inputs = tokenizer([r["text"] for r in batch], padding=True, return_tensors="pt")
        with torch.no_grad():
            predicted = model(**inputs).logits.argmax(-1).tolist()
        correct += sum(LABELS[p] == r["label"] for p, r in zip(predicted, batch, strict=True))
    print(json.dumps({"accuracy": correct / len(rows)}))


def swift_accuracy(python: Path, checkpoint: Path, test: Path) -> float:
    """ms-swift's own `swift infer` on the test reviews (it renders them as its training did)."""
    result = checkpoint.parent / "test-predictions.jsonl"
    command = [python.parent / "swift", "infer", "--adapters", checkpoint, "--val_dataset", test, "--result_path",
               result, "--max_batch_size", 16, "--dataset_num_proc", 1]  # fmt: skip
    subprocess.run([str(c) for c in command], check=True, capture_output=True)
    rows = [json.loads(line) for line in result.open()]
    return sum(r["response"] == r["labels"] for r in rows) / len(rows)


def timed(command, env=None) -> tuple[float, float]:
    """(wall seconds, peak resident GiB of the largest process) of a command; its output goes to a log."""
    started = time.perf_counter()
    result = subprocess.run(["/usr/bin/time", "-f", "PEAK_KB %M", *map(str, command)], capture_output=True, text=True,
                            env=env)  # fmt: skip
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{command[:4]} failed:\n" + (result.stdout + result.stderr)[-4000:])
    peak = max(int(line.split()[1]) for line in result.stderr.splitlines() if line.startswith("PEAK_KB"))
    return wall, peak / 2**20


def interleaved(make_runs, rounds: int, env, wanted=lambda name: True) -> dict:
    """Each run of `make_runs()` ({name: (command, a function giving its test accuracy)}, made anew each round),
    round by round in alternating order: {name: {"wall": [...], "peak": [...], "accuracy": [...]}}."""
    results = {}
    for round_ in range(rounds):
        order = [(name, run) for name, run in make_runs().items() if wanted(name)]
        for name, (command, accuracy) in order if round_ % 2 == 0 else order[::-1]:
            wall, peak = timed(command, env)
            entry = results.setdefault(name, {"wall": [], "peak": [], "accuracy": []})
            entry["wall"].append(wall)
            entry["peak"].append(peak)
            entry["accuracy"].append(accuracy())
            print(f"round {round_ + 1}: {name}: {wall:.1f} s, {peak:.2f} GiB, accuracy {entry['accuracy'][-1]:.3f}",
                  flush=True)  # fmt: skip
    return results


def ensure_swift() -> Path:
    python = SWIFT_VENV / "bin" / "python"
    if not (SWIFT_VENV / "bin" / "swift").exists():
        subprocess.run([sys.executable, "-m", "venv", str(SWIFT_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SWIFT_SPECS], check=True)
    return python


def runs(model: Path, split: dict, work: Path, swift_python: Path, bf16: bool) -> dict:
    """Each peer's command and how its test accuracy is read afterwards; with `bf16`, ours and the Trainer script
    again under bf16 autocast (fp32 weights), the recipe `--dtype auto` picks on CPUs with AVX512-BF16."""
    ours, ours_bf16 = work / "ours", work / "ours-bf16"
    swift_data = work / "swift"
    swift_data.mkdir(parents=True, exist_ok=True)
    for name in ("train", "dev", "test"):
        rows = [json.loads(line) for line in split[name].open()]
        (swift_data / f"{name}.jsonl").write_text("".join(
            json.dumps({"messages": [{"role": "user", "content": r["text"]}], "label": LABELS.index(r["label"])}) + "\n"
            for r in rows
        ))  # fmt: skip
    swift_out = work / "swift-run"
    shutil.rmtree(swift_out, ignore_errors=True)  # a fresh run each round (ms-swift resumes into a folder it finds)
    common = ["--max-steps", STEPS, "--batch-size", BATCH, "--lr", LR, "--seed", 0]
    train = [sys.executable, "-m", "stable_models", "train", "--model", model, "--train", split["train"],
             "--eval", split["dev"], "--overwrite", *common]  # fmt: skip
    trainer = [
        sys.executable,
        "-m",
        __spec__.name,
        "trainer",
        "--model",
        model,
        "--train",
        split["train"],
        "--dev",
        split["dev"],
    ]

    def trainer_run(folder: str, *flags) -> tuple:
        scored = lambda: trainer_accuracy(model, work / folder, split["test"])  # noqa: E731
        return [*trainer, "--output", work / folder, *flags], scored

    with_bf16 = {
        OURS["bf16"]: (
            [*train, "--output", ours_bf16, "--dtype", "bf16"],
            lambda: evaluate_ours(ours_bf16, split["test"]),
        ),
        f"{TRAINER_DYNAMIC}, bf16 autocast": trainer_run("trainer-dynamic-bf16", "--dynamic-padding", "--bf16"),
    }
    return {
        OURS["fp32"]: (
            [*train, "--output", ours, "--dtype", "fp32"], lambda: evaluate_ours(ours, split["test"])
        ),
        **(with_bf16 if bf16 else {}),
        TRAINER_DYNAMIC: trainer_run("trainer-dynamic", "--dynamic-padding"),
        TRAINER_DEFAULTS: trainer_run("trainer"),
        "ms-swift sft --task_type seq_cls": (
            [swift_python.parent / "swift", "sft", "--model", model, "--model_type", "llama", "--template", "chatml",
             "--template_backend", "jinja", "--task_type", "seq_cls", "--num_labels", 2, "--tuner_type", "lora",
             "--lora_rank", LORA_R, "--lora_alpha", 2 * LORA_R, "--lora_dropout", 0, "--target_modules", "all-linear",
             "--dataset", swift_data / "train.jsonl", "--val_dataset", swift_data / "dev.jsonl",
             "--max_steps", STEPS, "--per_device_train_batch_size", BATCH, "--per_device_eval_batch_size", BATCH,
             "--learning_rate", LR, "--warmup_ratio", WARMUP, "--lr_scheduler_type", "linear", "--weight_decay", 0,
             "--gradient_checkpointing", "false", "--eval_steps", STEPS, "--save_steps", STEPS,
             "--torch_dtype", "float32", "--seed", 0, "--output_dir", swift_out, "--add_version", "false",
             "--report_to", "none", "--dataloader_num_workers", 0, "--dataset_num_proc", 1],
            lambda: swift_accuracy(swift_python, swift_out / f"checkpoint-{STEPS}", swift_data / "test.jsonl"),
        ),
    }  # fmt: skip


def evaluate_ours(model: Path, test: Path, *flags) -> float:
    """Test accuracy from `stable-models evaluate` (`flags`: e.g. the text keys)."""
    report = model / "eval-test"
    command = [sys.executable, "-m", "stable_models", "evaluate", "--model", model, "--data", test, *flags]
    subprocess.run([*map(str, command), "--report-dir", str(report)], check=True, capture_output=True)
    return json.loads((report / "report.json").read_text())["accuracy"]


def trainer_accuracy(model: Path, run: Path, test: Path, module: str = __spec__.name) -> float:
    """Test accuracy of a peer's saved adapter, from `python -m MODULE score` (this benchmark's, or another's)."""
    command = [sys.executable, "-m", module, "score", "--model", model, "--adapter", run / "adapter", "--data", test]
    result = subprocess.run([str(c) for c in command], check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["accuracy"]


def peer_parser(description: str, peer: str, peer_help: str) -> tuple:
    """A benchmark's parser with its two internal modes: `peer` (train the peer: --model, --train, --dev,
    --output) and `score` (test accuracy of a saved adapter: --model, --adapter, --data). (parser, the peer's)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    trainer = sub.add_parser(peer, help=f"(internal) {peer_help}")
    for flag in ("--model", "--train", "--dev", "--output"):
        trainer.add_argument(flag, type=Path, required=True)
    scorer = sub.add_parser("score", help="(internal) test accuracy of a saved adapter")
    for flag in ("--model", "--adapter", "--data"):
        scorer.add_argument(flag, type=Path, required=True)
    return parser, trainer


def main() -> None:
    parser, trainer = peer_parser(__doc__, "trainer", "the Trainer + peft peer")
    trainer.add_argument("--bf16", action="store_true")
    trainer.add_argument("--dynamic-padding", action="store_true", help="--pad_to_max_length False")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="run only the runs whose names hold one of these words (ours always)")
    parser.add_argument("--bf16", action="store_true", help="also ours and the Trainer script under bf16 autocast")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-peers")
    args = parser.parse_args()
    if args.mode == "trainer":
        return train_with_trainer(args)
    if args.mode == "score":
        return score(args)
    from examples.cli_demo import CACHE, fetch, write_splits

    fetch("data")
    train, dev, test, _ = write_splits(CACHE / "data" / "rotten_tomatoes.jsonl", args.work / "data", 320, 0)
    split = {"train": train, "dev": dev, "test": test}
    model = CACHE / "models" / "smollm2-135m"
    wanted = lambda name: not args.only or name in OURS.values() or any(w in name for w in args.only)  # noqa: E731
    swift_python = ensure_swift() if wanted("ms-swift") else SWIFT_VENV / "bin" / "python"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    every = lambda: runs(model, split, args.work, swift_python, args.bf16)  # noqa: E731  (anew each round)
    results = interleaved(every, args.rounds, env, wanted)
    ours = {dtype: statistics.median(results[name]["wall"]) for dtype, name in OURS.items() if name in results}
    print("\n| | wall (median) | peak memory | test accuracy | ours faster by (same dtype) |")
    print("|---|---:|---:|---:|---:|")
    for name, entry in results.items():
        wall, ours_wall = statistics.median(entry["wall"]), ours["bf16" if "bf16" in name else "fp32"]
        print(f"| {name} | {wall:.1f} s | {max(entry['peak']):.2f} GiB | {statistics.mean(entry['accuracy']):.3f} | "
              f"{wall / ours_wall:.2f}x |")  # fmt: skip
    (args.work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
