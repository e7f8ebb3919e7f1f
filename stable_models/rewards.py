"""The reward-model side of `stable-models train / evaluate / predict`: preference files in, Bradley-Terry training
on packed pairs, pairwise evaluation (accuracy, margins, calibration, RewardBench sections), rewards out.

commands.py runs the steps every task shares (the lock, loading, LoRA, the Trainer, saving); this module holds what
differs for preference data. A reward model is a Stable classifier with one output labelled "reward".
"""

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch

from .calibration import (
    SCORING_CHUNK,
    calibrate_logits,
    logits_in_length_order,
    pair_logits,
    pairwise_metrics,
    save_in_place,
)
from .data import CliError, read_table, require_column
from .preference import (
    check_pairs,
    encode_pairs,
    encoded_pairs,
    is_preference,
    preference_layout,
    rendered_ids,
    require_template,
    response_layout,
    shown,
    template_summary,
)

REWARD = "reward"  # the one label of a reward model (config.id2label)


def is_reward_model(config) -> bool:
    return config.num_labels == 1 and str((config.id2label or {}).get(0)) == REWARD


def wants_preference(table, task) -> bool:
    """--task preference forces it; by default a table with `chosen` and `rejected` columns is preference data."""
    return task == "preference" or (task in (None, "auto") and is_preference(table))


def read_pairs(table, path, say=print):
    """The layout of a preference table, checked; a count of pairs whose two sides are identical is a warning."""
    layout = preference_layout(table, path)
    identical = check_pairs(table, layout, path)
    if identical:
        say(
            f"warning: {path}: chosen equals rejected in {identical} pair(s); they teach nothing (loss log 2 "
            "at any reward) and count as wrong in the accuracy",
            file=sys.stderr,
        )
    return layout


def check_renderable(layout, tokenizer, model, path) -> None:
    if layout.conversational:
        require_template(tokenizer, model, path)


def rendering(layout, tokenizer) -> str:
    """What `train` says about how the responses become tokens."""
    if layout.conversational:
        return f"conversations through {template_summary(tokenizer)}"
    return f"prompt + response texts, eos {tokenizer.eos_token!r} appended (as TRL's RewardTrainer)"


def training_pairs(args, tokenizer, model, data, say) -> tuple:
    """(train, eval) pair tables of token ids; pairs longer than --max-length (or the model's positions) a side are
    dropped, as TRL drops them, rather than cut before the token the reward is read from."""
    limit = min(args.max_length or 10**9, getattr(model.config.get_text_config(), "max_position_embeddings", 10**9))
    sets = []
    for table, layout, name in ((data.train, data.layouts[0], "training"), (data.eval, data.layouts[1], "eval")):
        pairs, dropped = encoded_pairs(table, tokenizer, layout, limit)
        if dropped:
            say(f"[train] {dropped} {name} pair(s) longer than {limit} tokens a side dropped", file=sys.stderr)
        if len(pairs) == 0:
            raise CliError(f"every {name} pair is longer than {limit} tokens a side; raise --max-length")
        sets.append(pairs)
    tokenizer.model_max_length = limit if limit < 10**9 else tokenizer.model_max_length
    return tuple(sets)


def preflight_examples(train_set) -> tuple[list, list, torch.dtype]:
    """The pre-flight's examples: the first pairs' responses, chosen labelled 1 and rejected 0 (a regression loss:
    the check is of the model's numerics, not of the pairwise loss)."""
    first = train_set[: min(4, len(train_set))]
    ids = [i for pair in zip(first["chosen_input_ids"], first["rejected_input_ids"], strict=True) for i in pair]
    return ids, [1.0, 0.0] * (len(ids) // 2), torch.float32


class PaddedPairCollator:
    """--no-packing (and recurrent models): the pair responses padded, in PackedPairCollator's order and labels."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features):
        from .packing import pair_responses

        responses = pair_responses(features)
        batch = dict(self.tokenizer.pad({"input_ids": [r["input_ids"] for r in responses]}, return_tensors="pt"))
        batch["labels"] = torch.stack([r["labels"] for r in responses])
        if "margin" in features[0]:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features])
        return batch


class PairInputs:
    """Passes on what the pair collators take (the `length` columns are for the sampler)."""

    KEYS = ("chosen_input_ids", "rejected_input_ids", "margin")

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        return self.collator([{k: f[k] for k in self.KEYS if k in f} for f in features])


def pair_collator(tokenizer, packing: bool):
    from .packing import PackedPairCollator

    return PairInputs(
        PackedPairCollator(pad_token_id=tokenizer.pad_token_id) if packing else PaddedPairCollator(tokenizer)
    )


def compute_pair_metrics(prediction) -> dict:
    """Trainer's evaluation: one row (r_chosen, r_rejected) per pair (PairwiseTrainer.prediction_step)."""
    rewards = torch.as_tensor(prediction.predictions).double()
    report = pairwise_metrics(rewards[:, 0], rewards[:, 1])
    return {k: v for k, v in report.items() if isinstance(v, float)}


def scored_rows(job, model, tokenizer, table, render, batch_size, llm=None):
    """Rewards of every row on rank 0 (None elsewhere): each rank scores its contiguous shard, SCORING_CHUNK rows at
    a time; `render(batch)` gives one or more token-id lists per row, which come back as columns."""
    from tqdm.auto import tqdm

    rows = job.shard(len(table))
    part = table.select(rows) if len(rows) != len(table) else table
    pieces = []
    with tqdm(total=len(part), desc="scoring", disable=not job.is_main, unit="row") as bar:
        for batch in part.iter(batch_size=SCORING_CHUNK):
            sides = render(batch)
            ids = [i for side in sides for i in side]
            if llm is not None:
                from .vllm_scoring import logits_of

                logits = logits_of(llm, ids)
            else:
                logits = logits_in_length_order(model, tokenizer, ids, batch_size)
            pieces.append(logits.reshape(len(sides), -1).T.double())
            bar.update(len(sides[0]))
    gathered = job.gather(torch.cat(pieces) if pieces else None)
    return None if gathered is None else torch.cat([p for p in gathered if p is not None])


def pair_renderer(tokenizer, layout):
    def render(batch):
        encoded = encode_pairs(batch, tokenizer, layout)
        return [encoded["chosen_input_ids"], encoded["rejected_input_ids"]]

    return render


def evaluate(args, job, model, tokenizer) -> None:
    """Pairwise accuracy, margins, calibration (`--calibrate` folds the Bradley-Terry temperature into `score`),
    per-subset accuracy and RewardBench sections; report.json and plots."""
    table = job.main_first(lambda: read_table(args.data))

    def check():
        if not is_preference(table):
            raise CliError(
                f"{args.data}: {args.model} is a reward model; evaluate it on preference data ('chosen' and 'rejected' "
                "columns)"
            )
        layout = read_pairs(table, args.data, job.say)
        check_renderable(layout, tokenizer, args.model, args.data)
        return layout

    layout = job.on_main(check)
    rewards = scored_rows(job, model, tokenizer, table, pair_renderer(tokenizer, layout), args.batch_size)
    job.on_main(lambda: write_pair_evaluation(args, model, table, layout, rewards))


def write_pair_evaluation(args, model, table, layout, rewards) -> None:
    from .plots import plot_rewards, write_report

    chosen, rejected = rewards[:, 0], rewards[:, 1]
    subsets = table["subset"] if layout.subset else None
    report = {"task": "preference", **pairwise_metrics(chosen, rejected, subsets)}
    if args.calibrate:
        fitted, calibrated = calibrate_logits(
            model, pair_logits(chosen, rejected), [1] * len(chosen), "single_label_classification"
        )
        chosen, rejected = calibrated[:, 1], calibrated[:, 0]
        report.update(pairwise_metrics(chosen, rejected, subsets))
        report["calibration"] = fitted
        save_in_place(model, Path(args.model))
    draw = partial(plot_rewards, report, chosen, rejected)
    write_report(args, report, draw, render_report, "Bradley-Terry temperature")


def render_report(report) -> str:
    lines = [f"preference pairs, {report['pairs']}"]
    lines.append(f"  {'accuracy':20} {report['accuracy']:.4f}  (pairwise: chosen scored above rejected)")
    lines.append(f"  {'margin':20} {report['margin_mean']:.4f} +- {report['margin_std']:.4f}")
    lines.append(f"  {'ece':20} {report['ece']:.4f}  (of sigmoid(r_chosen - r_rejected))")
    lines.append(
        f"  {'rewards':20} chosen {report['reward_chosen_mean']:.4f}, rejected {report['reward_rejected_mean']:.4f}"
    )
    for name, row in report.get("per_subset", {}).items():
        lines.append(f"  {name[:20]:20} {row['accuracy']:.4f}  ({row['pairs']} pairs)")
    for name, score in report.get("rewardbench_sections", {}).items():
        lines.append(f"  RewardBench {name:8} {score:.4f}")
    if "rewardbench_score" in report:
        lines.append(f"  RewardBench score    {report['rewardbench_score']:.4f}  (mean of the sections present)")
    return "\n".join(lines)


def predict(args, job, model, tokenizer, llm=None) -> None:
    """A reward per text or conversation; for a preference file both rewards and the preferred side; with
    --group-key, each response's rank in its group (1 = highest reward; best-of-n)."""
    output = Path(args.output)
    table = job.main_first(lambda: read_table(args.data))

    def check():
        if is_preference(table):
            layout = read_pairs(table, args.data, job.say)
            check_renderable(layout, tokenizer, args.model, args.data)
            return ("pairs", layout)
        key, conversational, prompt = response_layout(table, args.text_key, args.data)
        if conversational:
            require_template(tokenizer, args.model, args.data)
        if args.group_key:
            require_column(table, args.group_key, args.data, "--group-key")
        return ("responses", (key, conversational, prompt))

    kind, layout = job.on_main(check)
    if kind == "pairs":
        render = pair_renderer(tokenizer, layout)
    else:
        key, conversational, prompt = layout

        def render(batch):
            return [rendered_ids(tokenizer, batch[key], batch["prompt"] if prompt else None, conversational)]

    rewards = scored_rows(job, model, tokenizer, table, render, args.batch_size, llm)
    if job.is_main:
        write_rewards(output, table, kind, layout, rewards, args.group_key)
    job.say(f"predict: {len(table)} rows -> {output}")


def write_rewards(output: Path, table, kind, layout, rewards, group_key) -> None:
    """Rank 0 writes the rows in input order into a part file, moved onto --output when complete."""
    ranks = None
    if group_key:
        import pandas

        keys = [shown(v) for v in table[group_key]]
        ranks = pandas.Series(rewards[:, 0].numpy()).groupby(keys).rank(ascending=False, method="min").astype(int)
    part = output.with_name(f"{output.name}.part")
    copied = ["prompt"] if "prompt" in table.column_names else []
    copied += ["chosen", "rejected"] if kind == "pairs" else [layout[0]] + ([group_key] if group_key else [])
    copied = list(dict.fromkeys(copied))
    scores = ["reward_chosen", "reward_rejected", "preferred", "probability_chosen"] if kind == "pairs" else ["reward"]
    scores += ["rank"] if ranks is not None else []
    try:
        write_rows(part, output.suffix, table, kind, copied, scores, rewards, ranks)
    except BaseException:
        part.unlink(missing_ok=True)  # nothing half-written is left behind
        raise
    os.replace(part, output)


def write_rows(part: Path, suffix, table, kind, copied, scores, rewards, ranks) -> None:
    import csv

    with open(part, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=copied + scores) if suffix == ".csv" else None
        if writer:
            writer.writeheader()
        row = 0
        for batch in table.select_columns(copied).iter(batch_size=SCORING_CHUNK):
            for i in range(len(batch[copied[0]])):
                record = {c: shown(batch[c][i]) if writer else batch[c][i] for c in copied}
                values = rewards[row].tolist()
                if kind == "pairs":
                    difference = values[0] - values[1]
                    record.update(
                        reward_chosen=values[0],
                        reward_rejected=values[1],
                        preferred="chosen" if difference > 0 else "rejected" if difference < 0 else "tie",
                        probability_chosen=float(torch.sigmoid(torch.tensor(difference, dtype=torch.float64))),
                    )
                else:
                    record["reward"] = values[0]
                    if ranks is not None:
                        record["rank"] = int(ranks.iloc[row])
                if writer:
                    writer.writerow(record)
                else:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                row += 1
