"""Preference: reward models from pairs of responses, in TRL's layouts (preference_data.py reads and renders them).
Bradley-Terry training on packed pairs, pairwise evaluation (accuracy, margins, calibration, RewardBench sections),
and a reward per response out. A reward model is a Stable classifier with one output labelled "reward"."""

import sys
from dataclasses import dataclass
from functools import partial

import torch

from ..evaluators import PairwiseEvaluator
from ..modeling_files import REWARD_MODEL, model_kind
from .data import column_max, require_column
from .errors import CliError
from .preference_data import (
    PreferenceLayout,
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
from .task_steps import (
    Evaluation,
    ModelInputs,
    Options,
    Task,
    TrainingData,
    copied_rows,
    held_out,
    keep_trained_length,
    read_in,
)

REWARD = "reward"  # the one label of a reward model (config.id2label)
PAIR_SCORES = ["reward_chosen", "reward_rejected", "preferred", "probability_chosen"]


@dataclass(frozen=True)
class Pairs:
    """Preference pairs to score (evaluate; predict on a pair file): both responses of each row."""

    layout: PreferenceLayout


@dataclass(frozen=True)
class Responses:
    """Single responses to reward (predict): texts or conversations, an optional prompt column, optional groups."""

    key: str  # the response column
    conversational: bool
    prompt: bool  # an explicit `prompt` column
    group_key: str | None  # --group-key: rank the responses within each group


@dataclass(frozen=True)
class PreferenceOptions(Options):
    center_rewards: float | None = read_in("train")
    text_key: str | None = read_in("predict")
    group_key: str | None = read_in("predict")
    top_k: int | None = read_in("predict")


@dataclass(frozen=True)
class PairLayouts:
    """How the training and the eval pairs are laid out (TRL's layouts; the eval file may use another)."""

    train: PreferenceLayout
    eval: PreferenceLayout


class Preference(Task):
    name = "preference"
    kind = "reward models"
    noun = "pairs"
    Options = PreferenceOptions
    summary_keys = ("accuracy", "margin_mean", "loss", "ece")
    token_columns = ("chosen_input_ids", "rejected_input_ids")

    def claims(self, table) -> bool:
        return is_preference(table)  # `chosen` and `rejected` columns

    def owns_model(self, config) -> bool:
        return model_kind(config) == REWARD_MODEL

    # --- train
    def read(self, options, table, say) -> TrainingData:
        """--train (and --eval, or a held-out --eval-fraction) as checked preference pairs of one layout."""
        layout = read_pairs(table, options.train, say)
        table, eval_table, eval_layout = held_out(options, table, lambda t: (t, read_pairs(t, options.eval, say)))
        # a reward: one unbounded output
        layouts = PairLayouts(layout, eval_layout or layout)
        return TrainingData(self, table, eval_table, "regression", [REWARD], options, layouts)

    def describe_model(self, data) -> str:
        return "reward"

    def prepare(self, options, data, tokenizer, say) -> None:
        layouts = (data.details.train, data.details.eval)
        for layout, path in zip(layouts, (options.train, options.eval or options.train), strict=True):
            check_renderable(layout, tokenizer, options.model, path)
        say(
            f"[train] preference pairs ({data.details.train.describe()}): {rendering(data.details.train, tokenizer)}",
            file=sys.stderr,
        )

    def tokenize(self, options, tokenizer, limit, data, say) -> tuple:
        """(train, eval) pair tables of token ids; pairs longer than `limit` a side are dropped, as TRL drops them,
        rather than cut before the token the reward is read from."""
        sets = []
        for table, layout, name in (
            (data.train, data.details.train, "training"),
            (data.eval, data.details.eval, "eval"),
        ):
            pairs, dropped = encoded_pairs(table, tokenizer, layout, limit)
            if dropped:
                say(f"[train] {dropped} {name} pair(s) longer than {limit} tokens a side dropped", file=sys.stderr)
            if len(pairs) == 0:
                raise CliError(f"every {name} pair is longer than {limit} tokens a side; raise --max-length")
            sets.append(pairs)
        keep_trained_length(tokenizer, limit)
        return tuple(sets)

    def longest(self, train_set, tokenizer) -> int:
        return column_max(train_set, "longer")

    def collator(self, tokenizer, packing: bool, model):
        from ..packing import PackedPairCollator, PaddedPairCollator

        inner = PackedPairCollator(pad_token_id=tokenizer.pad_token_id) if packing else PaddedPairCollator(tokenizer)
        return ModelInputs(inner, (*self.token_columns, "margin"))

    def trainer_class(self):
        from ..trainers import PairwiseTrainer

        return PairwiseTrainer

    def trainer_options(self, options, data, eval_set) -> dict:
        from ..losses import BradleyTerryLoss

        return {"loss": BradleyTerryLoss(options.center_rewards)}

    def compute_metrics(self, data):
        return PairwiseEvaluator().compute_metrics

    def best_metric(self, data):
        return "accuracy", True

    def preflight_examples(self, data, train_set) -> tuple:
        """The first pairs' responses, chosen labelled 1 and rejected 0 (a regression loss: the check is of the
        model's numerics, not of the pairwise loss)."""
        first = train_set[: min(16, len(train_set))]
        ids = [i for pair in zip(first["chosen_input_ids"], first["rejected_input_ids"], strict=True) for i in pair]
        return ids, [1.0, 0.0] * (len(ids) // 2), torch.float32

    # --- evaluate and predict
    def evaluation_input(self, options, table, config, tokenizer, say) -> Pairs:
        if not is_preference(table):
            raise CliError(
                f"{options.data}: {options.model} is a reward model; evaluate it on preference data ('chosen' and "
                "'rejected' columns)"
            )
        return self.pairs(options, table, tokenizer, say)

    def prediction_input(self, options, table, config, tokenizer, say) -> Pairs | Responses:
        """Pairs, or single responses (texts or conversations) to reward."""
        if is_preference(table):
            return self.pairs(options, table, tokenizer, say)
        key, conversational, prompt = response_layout(table, options.text_key, options.data)
        if conversational:
            require_template(tokenizer, options.model, options.data)
        if options.group_key:
            require_column(table, options.group_key, options.data, "--group-key")
        return Responses(key, conversational, prompt, options.group_key)

    @staticmethod
    def pairs(options, table, tokenizer, say) -> Pairs:
        layout = read_pairs(table, options.data, say)
        check_renderable(layout, tokenizer, options.model, options.data)
        return Pairs(layout)

    def scored_columns(self, scoring: Pairs | Responses, options) -> list[str]:
        if isinstance(scoring, Pairs):
            layout = scoring.layout
            optional = [name for name, present in (("prompt", layout.prompt), ("margin", layout.margin)) if present]
            return ["chosen", "rejected"] + optional
        return list(dict.fromkeys([scoring.key] + (["prompt"] if scoring.prompt else []) + responses_group(scoring)))

    def render(self, scoring: Pairs | Responses, tokenizer, options, cuts):
        """Responses are scored whole (training drops over-long pairs rather than cut a response's end)."""
        if isinstance(scoring, Pairs):

            def render(batch):
                encoded = encode_pairs(batch, tokenizer, scoring.layout)
                return [encoded["chosen_input_ids"], encoded["rejected_input_ids"]]

            return render

        def render(batch):
            prompts = batch["prompt"] if scoring.prompt else None
            return [rendered_ids(tokenizer, batch[scoring.key], prompts, scoring.conversational)]

        return render

    def evaluation(self, options, model, table, scoring: Pairs, scores) -> Evaluation:
        """Pairwise accuracy, margins, calibration (--calibrate folds the Bradley-Terry temperature into `score`),
        per-subset accuracy and RewardBench sections."""
        from ..calibration import calibrate_pairwise
        from .plots import plot_rewards

        rewards = scores[:, :, 0].double()
        chosen, rejected = rewards[:, 0], rewards[:, 1]
        subsets = table["subset"] if scoring.layout.subset else None
        evaluator = PairwiseEvaluator(subsets)
        report = {"task": self.name, **evaluator(chosen, rejected)}
        if options.calibrate:
            fitted, chosen, rejected = calibrate_pairwise(model, chosen, rejected, [1] * len(chosen))
            report.update(evaluator(chosen, rejected))
            report["calibration"] = fitted
        draw = partial(plot_rewards, report, chosen, rejected)
        return Evaluation(report, draw, report_text, "Bradley-Terry temperature")

    def prediction_columns(self, scoring: Pairs | Responses, config, options) -> list[str]:
        if isinstance(scoring, Pairs):
            prompt = ["prompt"] if scoring.layout.prompt else []
            return list(dict.fromkeys(prompt + ["chosen", "rejected"])) + PAIR_SCORES
        copied = (["prompt"] if scoring.prompt else []) + [scoring.key] + responses_group(scoring)
        return list(dict.fromkeys(copied)) + ["reward"] + (["rank"] if scoring.group_key else [])

    def prediction_rows(self, batch, scores, scoring: Pairs | Responses, config, options) -> list[dict]:
        """A reward per response; for a pair file both rewards and the preferred side."""
        rows = copied_rows(batch, self.prediction_columns(scoring, config, options))
        for row, values in zip(rows, scores[:, :, 0].double().tolist(), strict=True):
            if isinstance(scoring, Pairs):
                difference = values[0] - values[1]
                row.update(
                    reward_chosen=values[0],
                    reward_rejected=values[1],
                    preferred="chosen" if difference > 0 else "rejected" if difference < 0 else "tie",
                    probability_chosen=float(torch.sigmoid(torch.tensor(difference, dtype=torch.float64))),
                )
            else:
                row["reward"] = values[0]
        return rows

    def ranked_by(self, scoring: Pairs | Responses, options):
        """--group-key: each response's rank in its group by reward (1 = highest; best-of-n)."""
        return (scoring.group_key, "reward") if isinstance(scoring, Responses) and scoring.group_key else None


def responses_group(scoring: Responses) -> list[str]:
    return [scoring.group_key] if scoring.group_key else []


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
