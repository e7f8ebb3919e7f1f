"""Classification: a label per text (or text pair). The label column decides the problem type, transformers'
`problem_type` switch: strings or integers are single-label, lists multi-label, floats regression."""

import math
import sys
from dataclasses import dataclass
from functools import partial

import torch

from ..evaluators import ClassificationEvaluator
from ..labels import encode_labels
from ..metrics import probabilities
from .classification_data import (
    check_known_labels,
    checked_problem_type,
    cut_rows,
    encoded,
    label_counts,
    label_names,
    texts_of,
    tokenize_cutting,
)
from .data import check_texts, column_max
from .errors import CliError
from .task_steps import (
    Evaluation,
    ModelInputs,
    Options,
    Task,
    TrainingData,
    held_out,
    keep_trained_length,
    read_in,
)

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"
# what each problem type refuses among the options classification reads
PROBLEM_OPTIONS = {
    "class_weights": ("--class-weights applies to single-label classification", (SINGLE,)),
    "label_smoothing": ("--label-smoothing applies to single-label classification", (SINGLE,)),
    "pos_weight": ("--pos-weight applies to multi-label classification", (MULTI,)),
}


@dataclass(frozen=True)
class Texts:
    """What evaluate and predict score for a classifier: a text (and a text pair) per row, and the model's outputs."""

    text_key: str
    pair_key: str | None
    problem_type: str
    names: list
    thresholds: list | None  # multi-label: per-label decision thresholds (--calibrate fits them), else 0.5

    @classmethod
    def of(cls, options, config) -> "Texts":
        names = [config.id2label[i] for i in range(config.num_labels)]
        thresholds = getattr(config, "multi_label_thresholds", None)
        return cls(options.text_key, options.text_pair_key, config.problem_type or SINGLE, names, thresholds)

    @property
    def label2id(self) -> dict:
        return {n: i for i, n in enumerate(self.names)}


@dataclass(frozen=True)
class ClassificationOptions(Options):
    text_key: str | None = read_in("train", "evaluate", "predict")
    text_pair_key: str | None = read_in("train", "evaluate", "predict")
    label_key: str | None = read_in("train", "evaluate")
    class_weights: str | None = read_in("train")
    label_smoothing: float | None = read_in("train")
    pos_weight: str | None = read_in("train")


class Classification(Task):
    name = "classification"
    kind = "classifiers"
    Options = ClassificationOptions
    summary_keys = ("accuracy", "f1_macro", "mse", "loss", "ece")

    def claims(self, table) -> bool:
        return True  # any labelled file; asked last

    def owns_model(self, config) -> bool:
        return True  # any classifier the tasks before it do not own

    # --- train
    def read(self, options, table, say) -> TrainingData:
        """--train (and --eval, or a held-out --eval-fraction of --train), checked: one label kind, at least two
        classes, every eval label known."""
        problem_type = checked_problem_type(table, options, options.train)

        def read_eval(eval_table):
            found = checked_problem_type(eval_table, options, options.eval)
            if found != problem_type:
                raise CliError(f"the eval labels are {found}, the training labels {problem_type}; make them one kind")
            return eval_table, found

        table, eval_table, _ = held_out(options, table, read_eval)
        names = label_names(table, options.label_key, problem_type) if problem_type != REGRESSION else ["score"]
        if problem_type == SINGLE and len(names) < 2:
            raise CliError(f"{options.train}: only one label ({names[0]!r}); a classifier needs at least two")
        data = TrainingData(self, table, eval_table, problem_type, names, options)
        check_known_labels(
            eval_table,
            options.label_key,
            problem_type,
            data.label2id,
            options.eval or f"{options.train} (the rows held out for eval)",
        )
        return data

    def best_metric(self, data):
        return ("mse", False) if data.problem_type == REGRESSION else ("f1_macro", True)

    def model_options(self, options, data: TrainingData) -> dict:
        head = super().model_options(options, data)
        for name, (refusal, problem_types) in PROBLEM_OPTIONS.items():
            if getattr(options, name) and data.problem_type not in problem_types:
                raise CliError(refusal)
        if options.class_weights:
            head["class_weights"] = class_weights(options.class_weights, data, options.label_key)
        if options.label_smoothing:
            head["label_smoothing"] = options.label_smoothing
        if options.pos_weight:
            head["pos_weight"] = parse_weights(options.pos_weight, "--pos-weight", len(data.names))
        return head

    def tokenize(self, options, tokenizer, limit, data: TrainingData, say) -> tuple:
        """(train, eval) tables of token ids, lengths and labels, truncated to `limit` (a cached `map`); the tokenizer
        remembers the longest, so evaluate and predict truncate where training did."""
        train_set = encoded(data.train, tokenizer, options, data.problem_type, data.label2id, limit)
        eval_set = encoded(data.eval, tokenizer, options, data.problem_type, data.label2id, limit)
        for table, path in ((train_set, options.train), (eval_set, options.eval or options.train)):
            warning = cut_rows(table, path, min(limit, tokenizer.model_max_length))
            if warning:
                say(warning, file=sys.stderr)
        keep_trained_length(tokenizer, max(column_max(train_set, "length"), column_max(eval_set, "length")))
        return train_set, eval_set

    def collator(self, tokenizer, packing: bool, model):
        from transformers import DataCollatorWithPadding

        from ..packing import PackedCollator

        inner = PackedCollator(pad_token_id=tokenizer.pad_token_id) if packing else DataCollatorWithPadding(tokenizer)
        return ModelInputs(inner, ("input_ids", "labels"))

    def compute_metrics(self, data: TrainingData):
        return ClassificationEvaluator(data.names, data.problem_type).compute_metrics

    def preflight_examples(self, data, train_set) -> tuple:
        """The first 32 rows' token ids and labels (the pre-flight takes a few of them)."""
        first = train_set[: min(32, len(train_set))]
        return first["input_ids"], first["labels"], torch.long if data.problem_type == SINGLE else torch.float32

    # --- evaluate and predict
    csv_prefixes = {"probabilities": "p_"}  # one CSV column per label: p_<label>

    def check_evaluate(self, options, config) -> None:
        if options.calibrate and (config.problem_type or SINGLE) == REGRESSION:
            raise CliError("--calibrate applies to classification; this model is a regression")

    def evaluation_input(self, options, table, config, tokenizer, say) -> Texts:
        texts = Texts.of(options, config)
        found = checked_problem_type(table, options, options.data)
        if found != texts.problem_type:
            raise CliError(f"{options.data}: labels are {found}, the model is {texts.problem_type}")
        check_known_labels(table, options.label_key, texts.problem_type, texts.label2id, options.data)
        return texts

    def prediction_input(self, options, table, config, tokenizer, say) -> Texts:
        check_texts(table, options.data, options.text_key, options.text_pair_key)
        return Texts.of(options, config)

    def scored_columns(self, scoring: Texts, options) -> list[str]:
        return [scoring.text_key] + ([scoring.pair_key] if scoring.pair_key else [])

    def render(self, scoring: Texts, tokenizer, options, cuts):
        def render(batch):
            texts, pairs = texts_of(batch, scoring.text_key, scoring.pair_key)
            ids, cut_from = tokenize_cutting(tokenizer, texts, pairs)
            cuts.add(cut_from, tokenizer.model_max_length)
            return [ids]

        return render

    def evaluation(self, options, model, table, scoring: Texts, scores) -> Evaluation:
        """The metrics and, with --calibrate, the temperature (and multi-label thresholds) folded into the model."""
        from ..calibration import calibrate_logits
        from .plots import plot_classification

        problem_type, names = scoring.problem_type, scoring.names
        logits = scores[:, 0]
        targets = encode_labels(table[options.label_key], problem_type, scoring.label2id, options.data)
        evaluator = ClassificationEvaluator(names, problem_type, scoring.thresholds)
        report = {
            "task": self.name,
            "problem_type": problem_type,
            "labels": names,
            **evaluator(logits, targets),
        }
        if options.calibrate:
            report["calibration"], logits = calibrate_logits(model, logits, targets, problem_type)
            report.update(evaluator(logits, targets, getattr(model.config, "multi_label_thresholds", None)))
        draw = partial(plot_classification, report, problem_type, names, logits, targets)
        return Evaluation(report, draw, report_text, "temperature")

    def prediction_columns(self, scoring: Texts, config, options) -> list[str]:
        if scoring.problem_type == REGRESSION:
            return ["text", "score"]
        columns = ["text", "labels"] if scoring.problem_type == MULTI else ["text", "label", "score"]
        return columns + [f"p_{n}" for n in scoring.names]

    def prediction_rows(self, batch, scores, scoring: Texts, config, options) -> list[dict]:
        """The label and its probability, every label over its threshold, or the score."""
        problem_type, names = scoring.problem_type, scoring.names
        thresholds = scoring.thresholds or [0.5] * len(names)
        rows = [{"text": str(text)} for text in batch[scoring.text_key]]
        for row, values in zip(rows, probabilities(scores[:, 0], problem_type).tolist(), strict=True):
            if problem_type == REGRESSION:
                row["score"] = values[0]
                continue
            if problem_type == SINGLE:
                best = max(range(len(values)), key=values.__getitem__)
                row.update(label=names[best], score=values[best])
            else:
                row["labels"] = [n for n, p, cut in zip(names, values, thresholds, strict=True) if p >= cut]
            row["probabilities"] = dict(zip(names, values, strict=True))
        return rows


def parse_weights(text: str, flag: str, count: int) -> list[float]:
    try:
        weights = [float(w) for w in str(text).split(",")]
    except ValueError:
        raise CliError(f"{flag} {text!r}: give {count} comma-separated numbers, in label order") from None
    if len(weights) != count or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise CliError(f"{flag} {text!r}: give {count} finite, non-negative numbers, in label order")
    return weights


def class_weights(value: str, data: TrainingData, key: str) -> list[float]:
    """`balanced` (n / (classes x count) over the training rows, as scikit-learn) or one weight per label."""
    names = data.names
    if value != "balanced":
        return parse_weights(value, "--class-weights", len(names))
    counts = label_counts(data.train, key, names)
    return [len(data.train) / (len(names) * c) if c else 0.0 for c in counts]


def report_text(report) -> str:
    """The evaluation report as a readable table."""
    lines = [f"{report['problem_type']}, {report['examples']} examples"]
    for key in ("accuracy", "f1_macro", "f1_micro", "roc_auc", "ece", "mse", "mae", "pearson", "spearman"):
        if report.get(key) is not None:
            lines.append(f"  {key:10} {report[key]:.4f}")
    if "per_class" in report:
        lines.append(f"  {'label':20} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}")
        for name, row in report["per_class"].items():
            lines.append(
                f"  {name[:20]:20} {row['precision']:9.4f} {row['recall']:9.4f} {row['f1']:9.4f} {row['support']:8d}"
            )
    if report["problem_type"] == SINGLE:
        lines.append("  confusion matrix (rows: true, columns: predicted)")
        lines += ["    " + " ".join(f"{n:6d}" for n in row) for row in report["confusion_matrix"]]
    return "\n".join(lines)


TASK = Classification()
