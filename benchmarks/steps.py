"""A demo job's training steps alone, three ways in one process, round by round in alternating order: the peer's
batches (each padded to its longest, the stock class), ours (the Stable class on the task's packed rows and loss), and
the ideal (each batch's real tokens in one row, no padding and no mask: the fewest tokens a step can train).

    STABLE_MODELS_VENV=.venv-demo ./dev demo --help >/dev/null    # the demo's venv (cli extra)
    .venv-demo/bin/python -m benchmarks.steps                     # the classifier demo: 40 steps of 8 reviews
    .venv-demo/bin/python -m benchmarks.steps --task preference   # the reward demo: 40 steps of 8 pairs
    .venv-demo/bin/python -m benchmarks.steps --task ranking      # the rerank demo: 20 steps of 4 groups of 4

Model and data come from PyPI wheels (cached). The jobs are the demos' own: `./dev demo` (Rotten Tomatoes reviews),
`./dev demo --reward` (a fresh over a rotten review of one movie, rendered as TRL's RewardTrainer renders them:
prompt + response + eos) and `./dev demo --rerank` (SciQ questions with their passage among BM25's top 20, each group
its positive and 3 negatives drawn per step, through the demo's chat template, cut at 256 tokens). `--task boolq`:
benchmarks/boolq_peers.py's job at global batch 32, the peer in micro-batches of 8 (at 32 it runs out of memory).

It bounds what an end-to-end comparison can show: both commands also pay start-up, evaluation and saving, so the
end-to-end ratio against a peer is at most its steps over the ideal's. Same batches (a seeded random order, like
Trainer's sampler), same LoRA (r 16, alpha 32, every decoder-layer linear), AdamW at the job's learning rate, fp32.
The ideal's loss is not the job's (its examples attend to each other, and only one is pooled); it is the compute
floor, not a recipe. A reranker's packed rows compute the tokens a group's documents share (template head, query)
once, so ours can go below the floor of real tokens: the table adds the floor of the tokens ours computes.
"""

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from examples.cli_demo import CACHE, fetch  # noqa: E402  (the demos' cache)

LORA_R = 16
JOBS = {  # job: (task, steps, examples per step, learning rate, the peer's micro-batch), as the demos run them
    "classification": ("classification", 40, 8, 1e-3, 8),
    "preference": ("preference", 40, 8, 1e-3, 8),
    "ranking": ("ranking", 20, 4, 5e-4, 4),
    "boolq": ("classification", 8, 32, 1e-3, 8),  # benchmarks/boolq_peers.py's job; its peer at 32 runs out of memory
}


def classification_examples(tokenizer, work: Path) -> list[dict]:
    from examples.cli_demo import write_splits

    fetch("data")
    train, _, _, _ = write_splits(CACHE / "data" / "rotten_tomatoes.jsonl", work / "data", 320, 0)
    labels = ["fresh", "rotten"]
    return [
        {"input_ids": tokenizer(r["text"])["input_ids"], "labels": labels.index(r["label"])}
        for r in map(json.loads, train.open())
    ]


def boolq_examples(tokenizer, work: Path) -> list[dict]:
    from boolq_peers import LABELS, TRAIN_ROWS, write_splits

    fetch("boolq")
    train = write_splits(CACHE / "data" / "boolq.jsonl", work / "boolq", TRAIN_ROWS, 0)["train"]
    return [
        {"input_ids": tokenizer(r["question"], r["passage"])["input_ids"], "labels": LABELS.index(r["label"])}
        for r in map(json.loads, train.open())
    ]


def preference_examples(tokenizer, work: Path) -> list[dict]:
    from examples.reward_demo import write_splits
    from stable_models.cli.preference_data import rendered_ids

    fetch("pairs")
    train, _, _, _ = write_splits(CACHE / "data" / "rotten_tomatoes_pairs.jsonl", work / "pairs", 320, 0)
    rows = [json.loads(line) for line in train.open()]
    prompts = [r["prompt"] for r in rows]
    chosen = rendered_ids(tokenizer, [r["chosen"] for r in rows], prompts, False)
    rejected = rendered_ids(tokenizer, [r["rejected"] for r in rows], prompts, False)
    return [{"chosen_input_ids": c, "rejected_input_ids": r} for c, r in zip(chosen, rejected, strict=True)]


def ranking_examples(tokenizer, work: Path, negatives=3, limit=256) -> list[dict]:
    from examples.rerank_demo import TEMPLATE, write_splits
    from stable_models.templates import RerankTemplate

    fetch("sciq")
    train, _, _ = write_splits(CACHE / "data" / "sciq.jsonl", work / "sciq", 600, 50, 20, 0)
    rng, template, groups = random.Random(0), RerankTemplate(TEMPLATE, ""), []
    for row in map(json.loads, train.open()):
        documents = row["pos"] + rng.sample(row["neg"], min(negatives, len(row["neg"])))  # the demo's --negatives
        ids, _ = template.ids(tokenizer, [row["query"]] * len(documents), documents, limit)
        groups.append({"input_ids": ids, "relevance": [1.0] * len(row["pos"]) + [0.0] * (len(documents) - 1)})
    return groups


def responses(task: str, example: dict) -> list[list[int]]:
    """The token-id lists one example trains: a text, a pair's two responses, a group's documents."""
    if task == "preference":
        return [example["chosen_input_ids"], example["rejected_input_ids"]]
    return example["input_ids"] if task == "ranking" else [example["input_ids"]]


def shared_start(ids: list[list[int]]) -> int:
    """How many leading tokens every list of a group has in common."""
    length = 0
    while all(len(i) > length for i in ids) and len({i[length] for i in ids}) == 1:
        length += 1
    return length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=list(JOBS), default="classification",
                        help="a demo's job, or boolq: benchmarks/boolq_peers.py's job at global batch 32")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, help="fewer steps than the job's (a quick check)")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-steps")
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import stable_models
    from stable_models.cli.fine_tuning import decoder_layer_linears
    from stable_models.losses import bradley_terry_loss, ranking_loss
    from stable_models.packing import PackedCollator, PackedGroupCollator, PackedPairCollator

    job = args.task
    args.task, steps, size, lr, peer_micro = JOBS[job]
    steps = args.steps or steps
    model_path = CACHE / "models" / "smollm2-135m"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    examples = globals()[f"{job}_examples"](tokenizer, args.work)
    order = random.Random(0).sample(range(len(examples)), len(examples))
    batches = [[examples[i] for i in order[s * size : (s + 1) * size]] for s in range(steps)]
    pad = tokenizer.pad_token_id

    def micro_batches(batch):  # the peer's micro-batches of a step (it accumulates where the whole batch won't fit)
        return [padded(batch[start : start + peer_micro]) for start in range(0, len(batch), peer_micro)]

    def padded(batch):  # the peer's batch: every list padded to the longest, the stock class's label per list
        lists = [ids for example in batch for ids in responses(args.task, example)]
        inputs = dict(tokenizer.pad({"input_ids": lists}, return_tensors="pt"))
        labels = [float(i % 2 == 0) for i in range(len(lists))]  # pairs: chosen first (the stock class has no BT)
        if args.task == "classification":
            labels = [example["labels"] for example in batch]
        elif args.task == "ranking":
            labels = [r for example in batch for r in example["relevance"]]
        dtype = torch.long if args.task == "classification" else torch.float32
        return {**inputs, "labels": torch.tensor(labels, dtype=dtype)}

    def one_row(batch):  # the floor: every real token of the batch in one row, one label
        tokens = [t for example in batch for ids in responses(args.task, example) for t in ids]
        return {
            "input_ids": torch.tensor([tokens]),
            "labels": torch.tensor([0 if args.task == "classification" else 0.0]),
        }

    def shared_once(batch):  # the floor of what ours computes for groups: each group's shared start once
        tokens = []
        for example in batch:
            lists = responses(args.task, example)
            start = shared_start(lists)
            tokens += lists[0][:start] + [t for ids in lists for t in ids[start:]]
        return {"input_ids": torch.tensor([tokens]), "labels": torch.tensor([0.0])}

    def ours_loss(model, x):
        if args.task == "classification":
            return model(**x).loss
        labels, rest = x["labels"], {k: v for k, v in x.items() if k not in ("labels", "group_sizes", "teacher")}
        outputs = model(**rest)
        if args.task == "preference":
            return bradley_terry_loss(outputs, labels)
        return ranking_loss(outputs.logits, labels, x["group_sizes"])

    collators = {
        "classification": PackedCollator(pad_token_id=pad),
        "preference": PackedPairCollator(pad_token_id=pad),
        "ranking": PackedGroupCollator(pad_token_id=pad, share_prefixes=True),
    }
    num_labels = 2 if args.task == "classification" else 1

    def setup(load, collate, loss=lambda model, x: model(**x).loss):
        torch.manual_seed(0)
        model = load(model_path, num_labels=num_labels, dtype=torch.float32)
        model.config.pad_token_id = pad
        lora = LoraConfig(task_type="SEQ_CLS", r=LORA_R, lora_alpha=2 * LORA_R,
                          target_modules=decoder_layer_linears(model))  # fmt: skip
        model = get_peft_model(model, lora).train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        steps = [collate(batch) for batch in batches]
        return model, optimizer, [x if isinstance(x, list) else [x] for x in steps], loss

    stock = AutoModelForSequenceClassification.from_pretrained
    setups = {
        "peer's batches (padded to the longest, stock class)": setup(stock, micro_batches),
        "ours (Stable class, packed rows, the task's loss)": setup(
            stable_models.from_pretrained, collators[args.task], ours_loss
        ),
        "ideal (real tokens, one row, no mask)": setup(stock, one_row),
    }
    if args.task == "ranking":
        setups["ideal of the tokens ours computes (a group's shared start once)"] = setup(stock, shared_once)
    walls = {name: [] for name in setups}
    for round_ in range(args.rounds):
        names = list(setups) if round_ % 2 == 0 else list(reversed(setups))
        for name in names:
            model, optimizer, inputs, loss = setups[name]
            started = time.perf_counter()
            for micro in inputs:
                for x in micro:
                    (loss(model, x) / len(micro)).backward()
                optimizer.step()
                optimizer.zero_grad()
            walls[name].append(time.perf_counter() - started)
            print(f"round {round_ + 1}: {name}: {walls[name][-1]:.1f} s", file=sys.stderr, flush=True)
    ideal = statistics.median(walls["ideal (real tokens, one row, no mask)"])
    print(f"| {job}: {steps} steps of {size} | token slots | wall (median of {args.rounds}) | vs the ideal |")
    print("|---|---:|---:|---:|")
    for name, times in walls.items():
        slots = sum(x["input_ids"].numel() for micro in setups[name][2] for x in micro)
        median = statistics.median(times)
        runs = ", ".join(f"{t:.1f}" for t in times)
        print(f"| {name} | {slots:,} | {median:.1f} s ({runs}) | {median / ideal:.2f}x |")


if __name__ == "__main__":
    main()
