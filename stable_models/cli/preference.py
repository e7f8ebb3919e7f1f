"""Preference: reward models from pairs of responses, in TRL's layouts (preference_data.py reads and renders them).
Bradley-Terry training on packed pairs, pairwise evaluation (accuracy, margins, calibration, RewardBench sections),
and a reward per response out. A reward model is a Stable classifier with one output labelled "reward"."""

import sys
from functools import partial

import torch

from ..metrics import pair_logits, pairwise_metrics
from .data import column_max, read_table, require_column, split_eval
from .errors import CliError
from .preference_data import (
    check_pairs,
    encode_pairs,
    encoded_pairs,
    is_preference,
    preference_layout,
    rendered_ids,
    require_template,
    response_layout,
    template_summary,
)
from .tasks import ModelInputs, Task, TrainingData

REWARD = "reward"  # the one label of a reward model (config.id2label)
PAIR_SCORES = ["reward_chosen", "reward_rejected", "preferred", "probability_chosen"]


class Preference(Task):
    name = "preference"
    kind = "reward models"
    noun = "pairs"
    reads = {"train": {"center_rewards"}, "predict": {"text_key", "group_key", "top_k"}}
    summary_keys = ("accuracy", "margin_mean", "loss", "ece")

    def claims(self, table) -> bool:
        return is_preference(table)  # `chosen` and `rejected` columns

    def owns_model(self, config) -> bool:
        return config.num_labels == 1 and str((config.id2label or {}).get(0)) == REWARD

    # --- train
    def read(self, args, table, say) -> TrainingData:
        """--train (and --eval, or a held-out --eval-fraction) as checked preference pairs of one layout."""
        layouts = [read_pairs(table, args.train, say)]
        if args.eval:
            eval_table = read_table(args.eval, args.encoding)
            layouts.append(read_pairs(eval_table, args.eval, say))
        else:
            table, eval_table = split_eval(table, args.eval_fraction, args.seed, args.train)
            layouts.append(layouts[0])
        # a reward: one unbounded output
        return TrainingData(self, table, eval_table, "regression", [REWARD], tuple(layouts))

    def describe_model(self, data) -> str:
        return "reward"

    def prepare(self, args, data, tokenizer, say) -> None:
        for layout, path in zip(data.details, (args.train, args.eval or args.train), strict=True):
            check_renderable(layout, tokenizer, args.model, path)
        say(
            f"[train] preference pairs ({data.details[0].describe()}): {rendering(data.details[0], tokenizer)}",
            file=sys.stderr,
        )

    def tokenize(self, args, tokenizer, limit, data, say) -> tuple:
        """(train, eval) pair tables of token ids; pairs longer than `limit` a side are dropped, as TRL drops them,
        rather than cut before the token the reward is read from."""
        sets = []
        for table, layout, name in ((data.train, data.details[0], "training"), (data.eval, data.details[1], "eval")):
            pairs, dropped = encoded_pairs(table, tokenizer, layout, limit)
            if dropped:
                say(f"[train] {dropped} {name} pair(s) longer than {limit} tokens a side dropped", file=sys.stderr)
            if len(pairs) == 0:
                raise CliError(f"every {name} pair is longer than {limit} tokens a side; raise --max-length")
            sets.append(pairs)
        tokenizer.model_max_length = limit if limit < 10**9 else tokenizer.model_max_length
        return tuple(sets)

    def longest(self, train_set, tokenizer) -> int:
        return column_max(train_set, "longer")

    def collator(self, tokenizer, packing: bool, model):
        from ..packing import PackedPairCollator

        inner = PackedPairCollator(pad_token_id=tokenizer.pad_token_id) if packing else PaddedPairCollator(tokenizer)
        return ModelInputs(inner, ("chosen_input_ids", "rejected_input_ids", "margin"))

    def trainer_class(self):
        from ..trainers import PairwiseTrainer

        return PairwiseTrainer

    def trainer_options(self, args, data, eval_set) -> dict:
        return {"center_rewards": args.center_rewards}

    def compute_metrics(self, data):
        return compute_pair_metrics

    def best_metric(self, data):
        return "accuracy", True

    def preflight_examples(self, data, train_set) -> tuple:
        """The first pairs' responses, chosen labelled 1 and rejected 0 (a regression loss: the check is of the
        model's numerics, not of the pairwise loss)."""
        first = train_set[: min(16, len(train_set))]
        ids = [i for pair in zip(first["chosen_input_ids"], first["rejected_input_ids"], strict=True) for i in pair]
        return ids, [1.0, 0.0] * (len(ids) // 2), torch.float32

    # --- evaluate and predict
    def scoring_input(self, args, table, config, tokenizer, command, say):
        """evaluate: preference pairs. predict: pairs, or single responses (texts or conversations) to reward."""
        if is_preference(table):
            layout = read_pairs(table, args.data, say)
            check_renderable(layout, tokenizer, args.model, args.data)
            return ("pairs", layout)
        if command == "evaluate":
            raise CliError(
                f"{args.data}: {args.model} is a reward model; evaluate it on preference data ('chosen' and 'rejected' "
                "columns)"
            )
        key, conversational, prompt = response_layout(table, args.text_key, args.data)
        if conversational:
            require_template(tokenizer, args.model, args.data)
        if args.group_key:
            require_column(table, args.group_key, args.data, "--group-key")
        return ("responses", (key, conversational, prompt))

    def scored_columns(self, spec, args) -> list[str]:
        kind, layout = spec
        if kind == "pairs":
            optional = [name for name, present in (("prompt", layout.prompt), ("margin", layout.margin)) if present]
            return ["chosen", "rejected"] + optional
        key, _, prompt = layout
        return list(
            dict.fromkeys([key] + (["prompt"] if prompt else []) + ([args.group_key] if args.group_key else []))
        )

    def render(self, spec, tokenizer, args, cuts):
        """Responses are scored whole (training drops over-long pairs rather than cut a response's end)."""
        kind, layout = spec
        if kind == "pairs":

            def render(batch):
                encoded = encode_pairs(batch, tokenizer, layout)
                return [encoded["chosen_input_ids"], encoded["rejected_input_ids"]]

            return render
        key, conversational, prompt = layout

        def render(batch):
            return [rendered_ids(tokenizer, batch[key], batch["prompt"] if prompt else None, conversational)]

        return render

    def evaluation(self, args, model, table, spec, scores) -> dict:
        """Pairwise accuracy, margins, calibration (--calibrate folds the Bradley-Terry temperature into `score`),
        per-subset accuracy and RewardBench sections."""
        from ..calibration import calibrate_logits
        from .plots import plot_rewards

        _, layout = spec
        rewards = scores[:, :, 0].double()
        chosen, rejected = rewards[:, 0], rewards[:, 1]
        subsets = table["subset"] if layout.subset else None
        report = {"task": self.name, **pairwise_metrics(chosen, rejected, subsets)}
        if args.calibrate:
            fitted, calibrated = calibrate_logits(
                model, pair_logits(chosen, rejected), [1] * len(chosen), "single_label_classification"
            )
            chosen, rejected = calibrated[:, 1], calibrated[:, 0]
            report.update(pairwise_metrics(chosen, rejected, subsets))
            report["calibration"] = fitted
        draw = partial(plot_rewards, report, chosen, rejected)
        return {"report": report, "draw": draw, "text": report_text, "fitted": "Bradley-Terry temperature"}

    def prediction_columns(self, spec, config, args) -> list[str]:
        kind, layout = spec
        if kind == "pairs":
            return list(dict.fromkeys((["prompt"] if layout.prompt else []) + ["chosen", "rejected"])) + PAIR_SCORES
        key, _, prompt = layout
        copied = list(
            dict.fromkeys((["prompt"] if prompt else []) + [key] + ([args.group_key] if args.group_key else []))
        )
        return copied + ["reward"] + (["rank"] if args.group_key else [])

    def prediction_rows(self, batch, scores, spec, config, args) -> list[dict]:
        """A reward per response; for a pair file both rewards and the preferred side."""
        kind, _ = spec
        copied = [c for c in self.prediction_columns(spec, config, args) if c in batch]
        rewards = scores[:, :, 0].double()
        rows = []
        for i, values in enumerate(rewards.tolist()):
            row = {c: batch[c][i] for c in copied}
            if kind == "pairs":
                difference = values[0] - values[1]
                row.update(
                    reward_chosen=values[0],
                    reward_rejected=values[1],
                    preferred="chosen" if difference > 0 else "rejected" if difference < 0 else "tie",
                    probability_chosen=float(torch.sigmoid(torch.tensor(difference, dtype=torch.float64))),
                )
            else:
                row["reward"] = values[0]
            rows.append(row)
        return rows

    def ranked_by(self, spec, args):
        """--group-key: each response's rank in its group by reward (1 = highest; best-of-n)."""
        return (args.group_key, "reward") if args.group_key and spec[0] == "responses" else None


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


class PaddedPairCollator:
    """--no-packing (and recurrent models): the pair responses padded, in PackedPairCollator's order and labels."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features):
        from ..packing import pair_responses

        responses = pair_responses(features)
        batch = dict(self.tokenizer.pad({"input_ids": [r["input_ids"] for r in responses]}, return_tensors="pt"))
        batch["labels"] = torch.stack([r["labels"] for r in responses])
        if "margin" in features[0]:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features])
        return batch


def compute_pair_metrics(prediction) -> dict:
    """Trainer's evaluation: one row (r_chosen, r_rejected) per pair (PairwiseTrainer.prediction_step)."""
    rewards = torch.as_tensor(prediction.predictions).double()
    report = pairwise_metrics(rewards[:, 0], rewards[:, 1])
    return {k: v for k, v in report.items() if isinstance(v, float)}


def report_text(report) -> str:
    """The evaluation report as a readable table."""
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


TASK = Preference()
