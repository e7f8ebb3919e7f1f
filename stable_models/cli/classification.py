"""Classification: a label per text (or text pair). The label column decides the problem type, transformers'
`problem_type` switch: strings or integers are single-label, lists multi-label, floats regression."""

import math
import sys
from functools import partial

import torch

from ..labels import encode_labels
from ..metrics import classification_metrics, probabilities
from .data import (
    check_known_labels,
    check_texts,
    column_max,
    cut_rows,
    encoded,
    label_counts,
    label_names,
    labelled,
    read_table,
    split_eval,
    texts_of,
    tokenize_cutting,
)
from .errors import CliError
from .tasks import ModelInputs, Task, TrainingData, refuse_options

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"


class Classification(Task):
    name = "classification"
    kind = "classifiers"
    reads = {
        "train": {"text_key", "text_pair_key", "label_key", "class_weights", "label_smoothing", "pos_weight"},
        "evaluate": {"text_key", "text_pair_key", "label_key"},
        "predict": {"text_key", "text_pair_key"},
    }
    summary_keys = ("accuracy", "f1_macro", "mse", "loss", "ece")

    def claims(self, table) -> bool:
        return True  # any labelled file; asked last

    def owns_model(self, config) -> bool:
        return True  # any classifier the tasks before it do not own

    @staticmethod
    def problem_type(config) -> str:
        return config.problem_type or SINGLE

    # --- train
    def read(self, args, table, say) -> TrainingData:
        """--train (and --eval, or a held-out --eval-fraction of --train), checked: one label kind, at least two
        classes, every eval label known."""
        problem_type = labelled(table, args, args.train)
        if args.eval:
            eval_table = read_table(args.eval, args.encoding)
            eval_problem_type = labelled(eval_table, args, args.eval)
            if eval_problem_type != problem_type:
                raise CliError(
                    f"the eval labels are {eval_problem_type}, the training labels {problem_type}; make them one kind"
                )
        else:
            table, eval_table = split_eval(table, args.eval_fraction, args.seed, args.train)
        names = label_names(table, args.label_key, problem_type) if problem_type != REGRESSION else ["score"]
        if problem_type == SINGLE and len(names) < 2:
            raise CliError(f"{args.train}: only one label ({names[0]!r}); a classifier needs at least two")
        data = TrainingData(self, table, eval_table, problem_type, names)
        check_known_labels(
            eval_table,
            args.label_key,
            problem_type,
            data.label2id,
            args.eval or f"{args.train} (the rows held out for eval)",
        )
        return data

    def best_metric(self, data):
        return ("mse", False) if data.problem_type == REGRESSION else ("f1_macro", True)

    def model_options(self, args, data: TrainingData) -> dict:
        options = super().model_options(args, data)
        if args.class_weights:
            if data.problem_type != SINGLE:
                refuse_options(args, ["class_weights"])
            options["class_weights"] = class_weights(args.class_weights, data, args.label_key)
        if args.label_smoothing:
            if data.problem_type != SINGLE:
                refuse_options(args, ["label_smoothing"])
            options["label_smoothing"] = args.label_smoothing
        if args.pos_weight:
            if data.problem_type != MULTI:
                refuse_options(args, ["pos_weight"])
            options["pos_weight"] = parse_weights(args.pos_weight, "--pos-weight", len(data.names))
        return options

    def tokenize(self, args, tokenizer, limit, data: TrainingData, say) -> tuple:
        """(train, eval) tables of token ids, lengths and labels, truncated to `limit` (a cached `map`); the tokenizer
        remembers the longest, so evaluate and predict truncate where training did."""
        train_set = encoded(data.train, tokenizer, args, data.problem_type, data.label2id, limit)
        eval_set = encoded(data.eval, tokenizer, args, data.problem_type, data.label2id, limit)
        for table, path in ((train_set, args.train), (eval_set, args.eval or args.train)):
            warning = cut_rows(table, path, min(limit, tokenizer.model_max_length))
            if warning:
                say(warning, file=sys.stderr)
        tokenizer.model_max_length = max(column_max(train_set, "length"), column_max(eval_set, "length"))
        return train_set, eval_set

    def collator(self, tokenizer, packing: bool, model):
        from transformers import DataCollatorWithPadding

        from ..packing import PackedCollator

        inner = PackedCollator(pad_token_id=tokenizer.pad_token_id) if packing else DataCollatorWithPadding(tokenizer)
        return ModelInputs(inner, ("input_ids", "labels"))

    def compute_metrics(self, data: TrainingData):
        def compute(prediction) -> dict:
            report = classification_metrics(
                torch.as_tensor(prediction.predictions), prediction.label_ids, data.problem_type, data.names
            )
            return {k: v for k, v in report.items() if isinstance(v, float)}

        return compute

    def preflight_examples(self, data, train_set) -> tuple:
        """The first 32 rows' token ids and labels (the pre-flight takes a few of them)."""
        first = train_set[: min(32, len(train_set))]
        return first["input_ids"], first["labels"], torch.long if data.problem_type == SINGLE else torch.float32

    # --- evaluate and predict
    def check_options(self, args, config, command) -> None:
        if command == "evaluate" and args.calibrate and self.problem_type(config) == REGRESSION:
            raise CliError("--calibrate applies to classification; this model is a regression")

    def scoring_input(self, args, table, config, tokenizer, command, say):
        if command == "predict":
            check_texts(table, args, args.data)
            return None
        problem_type, names = self.problem_type(config), output_names(config)
        found = labelled(table, args, args.data)
        if found != problem_type:
            raise CliError(f"{args.data}: labels are {found}, the model is {problem_type}")
        check_known_labels(table, args.label_key, problem_type, {n: i for i, n in enumerate(names)}, args.data)
        return None

    def scored_columns(self, spec, args) -> list[str]:
        return [args.text_key] + ([args.text_pair_key] if args.text_pair_key else [])

    def render(self, spec, tokenizer, args, cuts):
        def render(batch):
            texts, pairs = texts_of(batch, args.text_key, args.text_pair_key)
            ids, cut_from = tokenize_cutting(tokenizer, texts, pairs)
            cuts.add(cut_from, tokenizer.model_max_length)
            return [ids]

        return render

    def evaluation(self, args, model, table, spec, scores) -> dict:
        """The metrics and, with --calibrate, the temperature (and multi-label thresholds) folded into the model."""
        from ..calibration import calibrate_logits
        from .plots import plot_classification

        config = model.config
        problem_type, names = self.problem_type(config), output_names(config)
        logits = scores[:, 0]
        targets = encode_labels(table[args.label_key], problem_type, {n: i for i, n in enumerate(names)}, args.data)
        thresholds = getattr(config, "multi_label_thresholds", None)
        report = {
            "task": self.name,
            "problem_type": problem_type,
            "labels": names,
            **classification_metrics(logits, targets, problem_type, names, thresholds),
        }
        if args.calibrate:
            report["calibration"], logits = calibrate_logits(model, logits, targets, problem_type)
            report.update(
                classification_metrics(
                    logits, targets, problem_type, names, getattr(config, "multi_label_thresholds", None)
                )
            )
        draw = partial(plot_classification, report, problem_type, names, logits, targets)
        return {"report": report, "draw": draw, "text": report_text, "fitted": "temperature"}

    def prediction_columns(self, spec, config, args) -> list[str]:
        problem_type, names = self.problem_type(config), output_names(config)
        if problem_type == REGRESSION:
            return ["text", "score"]
        columns = ["text", "labels"] if problem_type == MULTI else ["text", "label", "score"]
        return columns + [f"p_{n}" for n in names]

    def prediction_rows(self, batch, scores, spec, config, args) -> list[dict]:
        """The label and its probability, every label over its threshold, or the score."""
        problem_type, names = self.problem_type(config), output_names(config)
        thresholds = getattr(config, "multi_label_thresholds", None) or [0.5] * len(names)
        texts = [str(t) for t in batch[args.text_key]]
        rows = []
        for text, row in zip(texts, probabilities(scores[:, 0], problem_type).tolist(), strict=True):
            if problem_type == REGRESSION:
                rows.append({"text": text, "score": row[0]})
            elif problem_type == SINGLE:
                best = max(range(len(row)), key=row.__getitem__)
                rows.append(
                    {
                        "text": text,
                        "label": names[best],
                        "score": row[best],
                        "probabilities": dict(zip(names, row, strict=True)),
                    }
                )
            else:
                chosen = [n for n, p, cut in zip(names, row, thresholds, strict=True) if p >= cut]
                rows.append({"text": text, "labels": chosen, "probabilities": dict(zip(names, row, strict=True))})
        return rows


def output_names(config) -> list:
    return [config.id2label[i] for i in range(config.num_labels)]


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
