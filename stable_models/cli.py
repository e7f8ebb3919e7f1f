"""`stable-models train | evaluate | predict | doctor`: from a data file to a calibrated classifier, served as saved.

    stable-models train --model BASE --train data.csv --label-key label --output out/clf
    stable-models evaluate --model out/clf --data test.csv --calibrate
    stable-models predict --model out/clf --data new.jsonl --output scores.jsonl

Bad input (a missing column, an empty file, mixed or NaN labels, an existing --output, ...) is one line on stderr and
exit code 2, before anything is written. Needs the `cli` extra (datasets, scikit-learn, matplotlib for the plots).
"""

import argparse
import importlib
import json
import math
import numbers
import os
import random
import shutil
import sys
from pathlib import Path

import torch

TASKS = ("single_label_classification", "multi_label_classification", "regression")
FORMATS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
TEMPERATURE_RANGE = (0.05, 20.0)
PLOTS_HINT = "pip install 'stable_models[cli]' for the PNG plots (matplotlib)"


class CliError(Exception):
    """Bad input: printed as one line, exit code 2, nothing written."""


# ---------------------------------------------------------------- data


def read_rows(path) -> list[dict]:
    """Rows of a CSV / TSV / JSON lines / JSON / Parquet file (optionally .gz / .bz2) or a datasets.save_to_disk
    folder, as dicts of Python values (JSON keeps its types; a missing CSV cell is NaN)."""
    source = Path(path)
    if source.is_dir():
        if not any((source / name).exists() for name in ("state.json", "dataset_dict.json")):
            raise CliError(f"{path}: a folder, but not one written by datasets' save_to_disk")
        import datasets

        loaded = datasets.load_from_disk(str(source))
        if isinstance(loaded, datasets.DatasetDict):
            if len(loaded) != 1:
                raise CliError(f"{path}: holds splits {list(loaded)}; point at one split's folder")
            loaded = next(iter(loaded.values()))
        rows = loaded.to_list()
    else:
        if not source.is_file():
            raise CliError(f"{path}: no such file")
        if source.stat().st_size == 0:
            raise CliError(f"{path} is empty")
        suffixes = [s for s in source.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
        kind = suffixes[-1] if suffixes else ""
        if kind not in FORMATS:
            raise CliError(f"{path}: unknown format {kind or '(no suffix)'!r}; use one of {', '.join(FORMATS)}")
        import pandas

        try:
            if kind in (".csv", ".tsv"):
                rows = pandas.read_csv(source, sep="\t" if kind == ".tsv" else ",").to_dict("records")
            elif kind == ".parquet":
                rows = pandas.read_parquet(source).to_dict("records")
            else:
                rows = read_json_rows(source, kind)
        except (ValueError, UnicodeDecodeError, pandas.errors.ParserError) as error:
            if "No columns to parse" in str(error):
                raise CliError(f"{path} is empty") from None
            raise CliError(f"{path}: cannot be read as {kind[1:]}: {str(error).splitlines()[0]}") from None
    rows = [{k: plain(v) for k, v in row.items()} for row in rows]
    if not rows:
        raise CliError(f"{path} is empty (no rows)")
    return rows


def read_json_rows(source: Path, kind: str) -> list[dict]:
    import pandas

    opener = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}.get(source.suffix)
    handle = importlib.import_module(opener).open(source, "rt") if opener else open(source)
    with handle:
        text = handle.read()
    if not text.strip():
        raise CliError(f"{source} is empty")
    if kind == ".json" and text.lstrip()[0] in "[{":
        try:
            data = json.loads(text)
            return data if isinstance(data, list) else pandas.DataFrame(data).to_dict("records")
        except json.JSONDecodeError:
            pass  # JSON lines in a .json file
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise ValueError(f"line {error.doc[: error.pos].count(chr(10)) + 1}: {error.msg}") from None


def plain(value):
    """numpy scalars and arrays (pandas, datasets) as Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def column(rows, key, path, flag):
    if key not in rows[0] and not any(key in row for row in rows):
        raise CliError(f"{path}: no column {key!r} (columns: {', '.join(map(str, rows[0]))}); pass {flag}")
    return [row.get(key) for row in rows]


def texts_of(rows, args, path):
    """(texts, pairs or None) with every text present."""
    texts = column(rows, args.text_key, path, "--text-key")
    pairs = column(rows, args.text_pair_key, path, "--text-pair-key") if args.text_pair_key else None
    for name, values in (("text", texts), ("text pair", pairs)):
        if values is None:
            continue
        bad = [i for i, v in enumerate(values) if is_missing(v) or not str(v).strip()]
        if bad:
            side = f" ({args.text_pair_key!r} missing where {args.text_key!r} is given)" if name == "text pair" else ""
            raise CliError(
                f"{path}: {name} missing or empty in {len(bad)} row(s){side}, first at row {bad[0] + 1}; "
                "fill or drop those rows"
            )
    return [str(t) for t in texts], None if pairs is None else [str(p) for p in pairs]


def label_task(labels, key, path) -> str:
    """Strings or integers: single-label; lists: multi-label; floats: regression. Refuses NaN and mixed kinds."""
    missing = [i for i, v in enumerate(labels) if is_missing(v)]
    if missing:
        raise CliError(
            f"{path}: label {key!r} is missing or NaN in {len(missing)} row(s), first at row {missing[0] + 1}; "
            "fill or drop those rows"
        )
    kinds = set()
    for value in labels:
        if isinstance(value, (list, tuple)):
            kinds.add("lists (multi-label)")
        elif isinstance(value, str):
            kinds.add("strings (single-label)")
        elif isinstance(value, numbers.Integral):  # bool included
            kinds.add("integers (single-label)")
        elif isinstance(value, numbers.Real):
            kinds.add("floats (regression)")
        else:
            kinds.add(type(value).__name__)
    if len(kinds) != 1:
        raise CliError(f"{path}: label {key!r} mixes kinds: {', '.join(sorted(kinds))}; make them one kind")
    kind = kinds.pop()
    if kind.startswith("lists"):
        return "multi_label_classification"
    if kind.startswith("floats"):
        return "regression"
    if "single-label" in kind:
        return "single_label_classification"
    raise CliError(f"{path}: label {key!r} holds {kind} values; use strings, integers, lists of them, or floats")


def labelled(rows, args, path):
    """(texts, pairs or None, labels, task) of a labelled file, checked once: every text there, one label kind."""
    texts, pairs = texts_of(rows, args, path)
    labels = column(rows, args.label_key, path, "--label-key")
    return texts, pairs, labels, label_task(labels, args.label_key, path)


def label_names(labels, task) -> list[str]:
    """The label map, sorted (numerically for integers): id i is names[i]."""
    values = {v for label in labels for v in (label if task == "multi_label_classification" else [label])}
    return [str(v) for v in sorted(values, key=lambda v: (isinstance(v, str), v))]


def encode_labels(labels, task, label2id, path):
    if task == "regression":
        return [float(v) for v in labels]
    unseen = sorted(
        {str(v) for label in labels for v in (label if isinstance(label, list) else [label])} - set(label2id)
    )
    if unseen:
        raise CliError(
            f"{path}: labels {unseen[:5]} are not among the model's labels {list(label2id)[:10]} "
            "(every label must occur in the training data)"
        )
    if task == "single_label_classification":
        return [label2id[str(v)] for v in labels]
    return [[1.0 if name in {str(v) for v in label} else 0.0 for name in label2id] for label in labels]


# ---------------------------------------------------------------- model


def fast_dtype() -> str:
    """bf16 where its matmuls are fast (CUDA with bf16, CPUs with AVX512-BF16 / AMX), else fp32: on an AVX2-only CPU a
    bf16 matmul is ~95x slower than fp32."""
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "fp32"
    return "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def check_model_path(model: str, gguf_file: str | None) -> None:
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        raise CliError(f"--model {model} is a GGUF file: pass its folder as --model and the name as --gguf-file")
    if path.exists() and not path.is_dir():
        raise CliError(f"--model {model}: not a checkpoint folder")
    if path.is_dir():
        wanted = path / gguf_file if gguf_file else path / "config.json"
        if not wanted.is_file():
            raise CliError(
                f"--model {model}: not a checkpoint (no {wanted.name}); point at a folder from save_pretrained"
            )


def load_tokenizer(model: str, gguf_file=None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as error:
        raise CliError(f"--model {model}: no tokenizer could be loaded ({str(error).splitlines()[0]})") from None


def load_classifier(model: str):
    """A classifier folder saved by `train` (or any Stable / stock classifier folder), in fp32, eval mode."""
    import stable_models

    check_model_path(model, None)
    if not Path(model).is_dir():
        raise CliError(f"--model {model}: no such folder")
    config = json.loads((Path(model) / "config.json").read_text())
    classes = config.get("architectures") or []
    if "AutoModelForSequenceClassification" not in (config.get("auto_map") or {}) and not any(
        name.endswith("ForSequenceClassification") for name in classes
    ):
        raise CliError(
            f"--model {model}: not a classifier ({', '.join(classes) or 'no architectures'}); train one first"
        )
    try:
        classifier = stable_models.from_pretrained(model, dtype=torch.float32)
    except (OSError, ValueError, TypeError) as error:
        raise CliError(f"--model {model}: {str(error).splitlines()[0]}") from None
    tokenizer = load_tokenizer(model)
    if tokenizer.pad_token_id is None:
        from .tokenization import setup_pad_token

        setup_pad_token(tokenizer)
    return classifier.eval(), tokenizer


def tokenize(tokenizer, texts, pairs, max_length=None):
    kwargs = {"truncation": True} if max_length is None else {"truncation": True, "max_length": max_length}
    encoded = tokenizer(texts, pairs, **kwargs) if pairs is not None else tokenizer(texts, **kwargs)
    return encoded["input_ids"]


@torch.no_grad()
def forward_in_length_order(model, tokenizer, texts, pairs, batch_size=16, progress=True):
    """Logits of every text in input order, computed on batches of similar length (less padding, same logits)."""
    from tqdm.auto import tqdm

    ids = tokenize(tokenizer, texts, pairs)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    logits = [None] * len(ids)
    device = next(model.parameters()).device
    for start in tqdm(range(0, len(order), batch_size), desc="scoring", disable=not progress, unit="batch"):
        chosen = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in chosen]}, return_tensors="pt")
        out = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
        for row, i in enumerate(chosen):
            logits[i] = out[row]
    return torch.stack(logits)


def probabilities(logits, task):
    if task == "single_label_classification":
        return logits.softmax(-1)
    if task == "multi_label_classification":
        return logits.sigmoid()
    return logits


# ---------------------------------------------------------------- metrics and calibration


def expected_calibration_error(confidence, correct, bins=15) -> float:
    """Mean |accuracy - confidence| over equal-width confidence bins, weighted by their share of the predictions."""
    confidence, correct = torch.as_tensor(confidence).flatten().double(), torch.as_tensor(correct).flatten().double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    total = 0.0
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = (confidence > low) & (confidence <= high) if low > 0 else (confidence >= low) & (confidence <= high)
        if inside.any():
            total += inside.double().mean().item() * abs(correct[inside].mean() - confidence[inside].mean()).item()
    return total


def calibration_points(logits, targets, task):
    """(confidence, correct) pairs that ECE and the reliability diagram read."""
    probs = probabilities(logits, task)
    if task == "single_label_classification":
        confidence, predicted = probs.max(-1)
        return confidence, (predicted == torch.as_tensor(targets)).double()
    return probs.flatten(), torch.as_tensor(targets, dtype=torch.float64).flatten()


def metrics(logits, targets, task, names, thresholds=None) -> dict:
    """The report: classification scores, a confusion matrix and ECE, or regression errors and correlations."""
    import numpy
    from sklearn import metrics as sk

    logits = torch.as_tensor(logits, dtype=torch.float32)
    if task == "regression":
        from scipy import stats

        predicted, truth = logits.squeeze(-1).numpy(), numpy.asarray(targets, dtype=numpy.float64)
        constant = numpy.ptp(predicted) == 0 or numpy.ptp(truth) == 0
        return {
            "examples": len(truth),
            "mse": float(sk.mean_squared_error(truth, predicted)),
            "mae": float(sk.mean_absolute_error(truth, predicted)),
            "pearson": None if constant else float(stats.pearsonr(truth, predicted)[0]),
            "spearman": None if constant else float(stats.spearmanr(truth, predicted)[0]),
        }
    probs = probabilities(logits, task).numpy()
    truth = numpy.asarray(targets)
    if task == "single_label_classification":
        predicted = probs.argmax(-1)
        labels = list(range(len(names)))
    else:
        cut = numpy.asarray(thresholds if thresholds is not None else [0.5] * len(names))
        predicted = (probs >= cut).astype(int)
        truth = truth.astype(int)
        labels = None
    precision, recall, f1, support = sk.precision_recall_fscore_support(
        truth, predicted, labels=labels, zero_division=0
    )
    report = {
        "examples": len(truth),
        "accuracy": float(sk.accuracy_score(truth, predicted)),
        "f1_macro": float(sk.f1_score(truth, predicted, average="macro", labels=labels, zero_division=0)),
        "f1_micro": float(sk.f1_score(truth, predicted, average="micro", labels=labels, zero_division=0)),
        "per_class": {
            name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(names, precision, recall, f1, support, strict=True)
        },
        "ece": expected_calibration_error(*calibration_points(logits, targets, task)),
    }
    if task == "single_label_classification":
        report["confusion_matrix"] = sk.confusion_matrix(truth, predicted, labels=labels).tolist()
        if len(names) == 2 and len(set(truth.tolist())) == 2:
            report["roc_auc"] = float(sk.roc_auc_score(truth, probs[:, 1]))
    else:
        present = [c for c in range(len(names)) if 0 < truth[:, c].sum() < len(truth)]
        if present:
            report["roc_auc"] = float(sk.roc_auc_score(truth[:, present], probs[:, present], average="macro"))
        report["confusion_matrix"] = sk.multilabel_confusion_matrix(truth, predicted).tolist()
    return report


def negative_log_likelihood(logits, targets, task) -> float:
    """What temperature scaling minimises (ECE is binned, so it may move either way by a little)."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    if task == "single_label_classification":
        return torch.nn.functional.cross_entropy(logits, torch.as_tensor(targets, dtype=torch.long)).item()
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.as_tensor(targets).double()).item()


def fit_temperature(logits, targets, task) -> float:
    """The temperature T (within TEMPERATURE_RANGE) that minimises the eval set's negative log-likelihood of
    logits / T."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    if task == "single_label_classification":
        targets = torch.as_tensor(targets, dtype=torch.long)

        def nll():
            return torch.nn.functional.cross_entropy(logits / log_t.exp(), targets)
    else:
        targets = torch.as_tensor(targets, dtype=torch.float64)

        def nll():
            return torch.nn.functional.binary_cross_entropy_with_logits(logits / log_t.exp(), targets)

    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = nll()
        loss.backward()
        return loss

    optimizer.step(closure)
    # a separable eval set drives T towards 0 (certainty); keep it within what a held-out set can support
    return float(log_t.detach().exp().clamp(*TEMPERATURE_RANGE))


def fit_thresholds(probs, targets) -> list[float]:
    """Per class, the probability cut that maximises that class's F1 on the eval set (0.5 where it has no positives)."""
    probs, targets = torch.as_tensor(probs), torch.as_tensor(targets, dtype=torch.float64)
    cuts = []
    for c in range(probs.shape[1]):
        if targets[:, c].sum() == 0:
            cuts.append(0.5)
            continue
        best, best_f1 = 0.5, -1.0
        for cut in sorted(set(probs[:, c].tolist())):
            predicted = (probs[:, c] >= cut).double()
            true_positive = (predicted * targets[:, c]).sum().item()
            f1 = 2 * true_positive / (predicted.sum().item() + targets[:, c].sum().item())
            if f1 > best_f1:
                best, best_f1 = cut, f1
        cuts.append(float(best))
    return cuts


def save_in_place(model, folder: Path) -> None:
    """Save next to `folder`, then swap the files in, so an interrupted save leaves the old checkpoint whole."""
    staging = folder / ".stable-models-saving"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    for item in staging.iterdir():
        if item.name != "README.md":
            os.replace(item, folder / item.name)
    shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------- plots


def plot_report(report, task, names, logits, targets, folder: Path, training_log=None) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    if task == "single_label_classification":
        figure, axes = plt.subplots(figsize=(1.2 * len(names) + 3, 1.2 * len(names) + 2))
        matrix = report["confusion_matrix"]
        axes.imshow(matrix, cmap="Blues")
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                axes.text(j, i, str(count), ha="center", va="center")
        axes.set(xticks=range(len(names)), yticks=range(len(names)), xticklabels=names, yticklabels=names)
        axes.set(xlabel="predicted", ylabel="true", title="confusion matrix")
        written.append(save_figure(figure, folder / "confusion_matrix.png"))
    if task != "regression":
        confidence, correct = calibration_points(logits, targets, task)
        edges = torch.linspace(0, 1, 11)
        centres, accuracy = [], []
        for low, high in zip(edges[:-1], edges[1:], strict=True):
            inside = (confidence >= low) & (confidence <= high)
            if inside.any():
                centres.append(confidence[inside].mean().item())
                accuracy.append(correct[inside].mean().item())
        figure, axes = plt.subplots(figsize=(4.5, 4.5))
        axes.plot([0, 1], [0, 1], "--", color="grey", label="perfectly calibrated")
        axes.plot(centres, accuracy, "o-", label=f"model (ECE {report['ece']:.3f})")
        axes.set(xlabel="confidence", ylabel="accuracy", title="reliability diagram", xlim=(0, 1), ylim=(0, 1))
        axes.legend()
        written.append(save_figure(figure, folder / "reliability.png"))
    if training_log:
        panels = [("loss", "training loss"), ("grad_norm", "gradient norm"), ("eval_loss", "eval loss")]
        figure, axes = plt.subplots(1, 3, figsize=(13, 3.5))
        for axis, (key, title) in zip(axes, panels, strict=True):
            points = [(e["step"], e[key]) for e in training_log if key in e and e[key] is not None]
            if points:
                axis.plot(*zip(*points, strict=True), "o-" if len(points) < 30 else "-")
            axis.set(xlabel="step", title=title)
        written.append(save_figure(figure, folder / "training_curves.png"))
    return written


def save_figure(figure, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return str(path)


# ---------------------------------------------------------------- commands


def check_output_dir(output: Path, overwrite: bool, resume: bool) -> None:
    if output.exists() and not output.is_dir():
        raise CliError(f"--output {output} is a file; give a directory")
    if output.is_dir() and any(output.iterdir()) and not (overwrite or resume):
        raise CliError(f"--output {output} exists and is not empty; pass --overwrite, --resume, or another directory")


def split_eval(columns, fraction, seed):
    """(train columns, eval columns): a seeded random `fraction` of the rows held out, each column split alike."""
    if not 0 < fraction < 1:
        raise CliError(f"--eval-fraction {fraction} must be between 0 and 1")
    rows = len(columns[0])
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    count = max(1, round(rows * fraction))
    if count >= rows:
        raise CliError(f"--train has {rows} row(s): too few to hold out an eval set; pass --eval FILE")

    def pick(indices):
        return [None if values is None else [values[i] for i in indices] for values in columns]

    return pick(order[count:]), pick(order[:count])


def decoder_layer_linears(model) -> list[str]:
    """The names LoRA targets: every linear layer inside the decoder layers (attention and MLP; GPT-2's Conv1D
    included), for any architecture."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.pytorch_utils import Conv1D

    names = set()
    for layer in (m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)):
        names |= {n.split(".")[-1] for n, m in layer.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    if not names:
        raise CliError(f"{type(model).__name__}: no linear layers in its decoder layers for LoRA; pass --full")
    return sorted(names)


def preflight(model, tokenizer, texts, pairs, labels, task, folder) -> None:
    """The doctor's checks on the first examples: finite loss and gradients, padding-invariant logits, an fp32 loss
    that honours num_items_in_batch. Stops with the doctor's report when one fails."""
    from .doctor import PADDING_TOLERANCE, run_one

    count = min(8, len(texts))
    ids = tokenize(tokenizer, texts[:count], pairs[:count] if pairs else None)
    batch = dict(tokenizer.pad({"input_ids": ids}, return_tensors="pt"))
    alone = [dict(tokenizer.pad({"input_ids": [one]}, return_tensors="pt")) for one in ids]
    dtype = torch.long if task == "single_label_classification" else torch.float32
    result = run_one(model, batch, alone, torch.tensor(labels[:count], dtype=dtype))
    model.train()
    tolerance = PADDING_TOLERANCE[torch.float32] * max(1.0, result["logit scale"])
    problems = []
    if not result["finite"]:
        problems.append(f"non-finite loss, logits or gradients (first at {result['first non-finite']})")
    elif result["padding error"] > tolerance:
        problems.append(f"padding changes the logits by {result['padding error']:.2e}")
    elif not result["honours num_items_in_batch"] or result["loss dtype"] != torch.float32:
        problems.append("the loss is not an fp32 loss that honours num_items_in_batch")
    if problems:
        raise SystemExit(
            f"stable-models: the pre-flight check failed: {problems[0]}. `python -m stable_models doctor --model "
            f"{folder}` gives the full report."
        )
    print(f"[train] pre-flight ok: finite, padding changes logits by {result['padding error']:.1e}", file=sys.stderr)


def train(args) -> int:
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorWithPadding, EarlyStoppingCallback, TrainingArguments

    import stable_models

    from .modeling_stable import recurrent_layer_kinds
    from .tokenization import setup_pad_token
    from .trainer import StableTrainer
    from .training import StopOnNonFinite

    output = Path(args.output)
    check_output_dir(output, args.overwrite, args.resume)
    if args.full and args.qlora:
        raise CliError("--full and --qlora exclude each other")
    check_model_path(args.model, args.gguf_file)
    texts, pairs, raw_labels, task = labelled(read_rows(args.train), args, args.train)
    if args.eval:
        eval_texts, eval_pairs, eval_raw, eval_task = labelled(read_rows(args.eval), args, args.eval)
        if eval_task != task:
            raise CliError(f"the eval labels are {eval_task}, the training labels {task}; make them one kind")
    else:
        (texts, pairs, raw_labels), (eval_texts, eval_pairs, eval_raw) = split_eval(
            [texts, pairs, raw_labels], args.eval_fraction, args.seed
        )
    names = label_names(raw_labels, task) if task != "regression" else ["score"]
    label2id = {name: i for i, name in enumerate(names)}
    labels = encode_labels(raw_labels, task, label2id, args.train)
    eval_labels = encode_labels(eval_raw, task, label2id, args.eval or "the held-out rows")
    if task == "single_label_classification" and len(names) < 2:
        raise CliError(f"{args.train}: only one label ({names[0]!r}); a classifier needs at least two")

    transformers.set_seed(args.seed)
    dtype = fast_dtype() if args.dtype == "auto" else args.dtype
    options = {}
    if args.class_weights:
        if task != "single_label_classification":
            raise CliError("--class-weights applies to single-label classification")
        options["class_weights"] = class_weights(args.class_weights, labels, names)
    if args.label_smoothing:
        options["label_smoothing"] = args.label_smoothing
    if args.pos_weight:
        if task != "multi_label_classification":
            raise CliError("--pos-weight applies to multi-label classification")
        options["pos_weight"] = parse_weights(args.pos_weight, "--pos-weight", len(names))
    load = dict(
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id=label2id,
        problem_type=task,
        pooling=args.pooling,
        dtype=torch.float32,
        ignore_mismatched_sizes=True,
        **options,
    )
    if args.gguf_file:
        load["gguf_file"] = args.gguf_file
    quantized = dict(load)
    if args.qlora:
        compute = torch.bfloat16 if dtype == "bf16" else torch.float32
        quantized["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
        )
        quantized["device_map"] = "auto" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer(args.model, args.gguf_file)
    print(
        f"[train] loading {args.model} as a {task.replace('_', ' ')} model with {len(names)} output(s)", file=sys.stderr
    )
    try:
        model = stable_models.from_pretrained(args.model, **quantized)
    except ValueError as error:
        raise CliError(f"--model {args.model}: {str(error).splitlines()[0]}") from None
    if args.gguf_file:  # dequantized on load: a plain fp32 model, saved without GGUF quantization settings
        model.hf_quantizer, model.is_quantized = None, False
        model.config.__dict__.pop("quantization_config", None)
    setup_pad_token(tokenizer, model)
    limit = min(args.max_length or 10**9, getattr(model.config.get_text_config(), "max_position_embeddings", 10**9))
    ids = tokenize(tokenizer, texts, pairs, limit)
    eval_ids = tokenize(tokenizer, eval_texts, eval_pairs, limit)
    max_length = max(len(i) for i in ids + eval_ids)
    tokenizer.model_max_length = max_length  # evaluate / predict truncate where training did
    print(
        f"[train] {len(ids)} train / {len(eval_ids)} eval examples, max length {max_length}, {dtype}", file=sys.stderr
    )
    preflight(model, tokenizer, texts, pairs, labels, task, args.model)

    if not args.full:
        if args.qlora:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        lora = LoraConfig(
            task_type="SEQ_CLS", r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules=decoder_layer_linears(model)
        )
        model = get_peft_model(model, lora)
    recurrent = recurrent_layer_kinds(model.config)
    collator = (
        DataCollatorWithPadding(tokenizer)
        if recurrent or args.no_packing
        else stable_models.PackedCollator(pad_token_id=tokenizer.pad_token_id)
    )
    train_set = [{"input_ids": i, "labels": y} for i, y in zip(ids, labels, strict=True)]
    eval_set = [{"input_ids": i, "labels": y} for i, y in zip(eval_ids, eval_labels, strict=True)]
    steps_per_epoch = math.ceil(len(train_set) / (args.batch_size * args.grad_accum))
    total_steps = args.max_steps or math.ceil(steps_per_epoch * args.epochs)
    eval_steps = args.eval_steps or max(1, total_steps // 5)
    best_metric = "mse" if task == "regression" else "f1_macro"
    checkpoints = output / "checkpoints"
    training = TrainingArguments(
        output_dir=str(checkpoints),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=2 * args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr or (2e-5 if args.full else 2e-4),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        warmup_steps=max(1, total_steps // 20),
        eval_strategy="steps",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=eval_steps,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model=best_metric,
        greater_is_better=task != "regression",
        logging_steps=max(1, min(eval_steps, total_steps // 20)),
        seed=args.seed,
        bf16=dtype == "bf16",
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        remove_unused_columns=False,
        label_names=["labels"],
        disable_tqdm=False,
    )
    callbacks = [StopOnNonFinite()]
    if args.early_stopping:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=args.early_stopping))

    def compute_metrics(prediction):
        report = metrics(torch.as_tensor(prediction.predictions), prediction.label_ids, task, names)
        return {k: v for k, v in report.items() if isinstance(v, float)}

    trainer = StableTrainer(
        model=model,
        args=training,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=collator,
        compute_metrics=compute_metrics,
        callbacks=callbacks,
    )
    resume = args.resume and any(checkpoints.glob("checkpoint-*"))
    if args.resume and not resume:
        print(f"[train] --resume: no checkpoint in {checkpoints}, starting from step 0", file=sys.stderr)
    trainer.train(resume_from_checkpoint=True if resume else None)
    history = list(trainer.state.log_history)
    final = trainer.evaluate()  # the best checkpoint's, which load_best_model_at_end restored
    model = trainer.model
    if args.qlora:  # merge into the full-precision base, not into 4-bit weights: the folder is a plain checkpoint
        from peft import PeftModel

        model.save_pretrained(checkpoints / "adapter")
        base = stable_models.from_pretrained(args.model, **load)
        if len(tokenizer) > base.get_input_embeddings().num_embeddings:  # setup_pad_token added a pad row
            base.resize_token_embeddings(len(tokenizer))  # (peft saved the resized embeddings with the adapter)
        base.config.pad_token_id = tokenizer.pad_token_id
        model = PeftModel.from_pretrained(base, checkpoints / "adapter")
    if not args.full:
        model = model.merge_and_unload()
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    (output / "training_log.json").write_text(json.dumps(history, indent=1))
    summary = {k.removeprefix("eval_"): v for k, v in final.items() if isinstance(v, (int, float))}
    (output / "eval_metrics.json").write_text(json.dumps(summary, indent=1))
    shown = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k in ("accuracy", "f1_macro", "mse", "loss", "ece"))
    print(f"[train] done: {shown}")
    print(f"[train] model: {output} (AutoModelForSequenceClassification.from_pretrained(dir, trust_remote_code=True))")
    print(f"[train] next: stable-models evaluate --model {output} --data <test file> --calibrate")
    print(f"[train] serve: python -m vllm.entrypoints.openai.api_server --model {output} --runner pooling")
    return 0


def parse_weights(text: str, flag: str, count: int) -> list[float]:
    try:
        weights = [float(w) for w in str(text).split(",")]
    except ValueError:
        raise CliError(f"{flag} {text!r}: give {count} comma-separated numbers, in label order") from None
    if len(weights) != count or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise CliError(f"{flag} {text!r}: give {count} finite, non-negative numbers, in label order")
    return weights


def class_weights(value: str, labels, names) -> list[float]:
    """`balanced` (n / (classes x count), as scikit-learn) or one weight per label."""
    if value != "balanced":
        return parse_weights(value, "--class-weights", len(names))
    counts = [labels.count(i) for i in range(len(names))]
    return [len(labels) / (len(names) * c) if c else 0.0 for c in counts]


def evaluate(args) -> int:
    model, tokenizer = load_classifier(args.model)
    task = model.config.problem_type or "single_label_classification"
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    texts, pairs, raw, found = labelled(read_rows(args.data), args, args.data)
    if found != task:
        raise CliError(f"{args.data}: labels are {found}, the model is {task}")
    targets = encode_labels(raw, task, {n: i for i, n in enumerate(names)}, args.data)
    report_dir = Path(args.report_dir or Path(args.model) / "evaluation")
    logits = forward_in_length_order(model, tokenizer, texts, pairs, args.batch_size)
    thresholds = getattr(model.config, "multi_label_thresholds", None)
    report = {"task": task, "labels": names, **metrics(logits, targets, task, names, thresholds)}
    if args.calibrate:
        if task == "regression":
            raise CliError("--calibrate applies to classification; this model is a regression")
        temperature = fit_temperature(logits, targets, task)
        nll_before = negative_log_likelihood(logits, targets, task)
        head = model.score
        with torch.no_grad():
            head.weight.div_(temperature)
            if head.bias is not None:
                head.bias.div_(temperature)
        logits = logits / temperature
        model.config.calibration_temperature = getattr(model.config, "calibration_temperature", 1.0) * temperature
        calibrated = {"temperature": temperature, "ece_before": report["ece"], "nll_before": nll_before}
        calibrated["nll_after"] = negative_log_likelihood(logits, targets, task)
        if task == "multi_label_classification":
            thresholds = fit_thresholds(probabilities(logits, task), targets)
            model.config.multi_label_thresholds = thresholds
            calibrated["thresholds"] = dict(zip(names, thresholds, strict=True))
        report.update(metrics(logits, targets, task, names, thresholds))
        report["calibration"] = {**calibrated, "ece_after": report["ece"]}
        save_in_place(model, Path(args.model))
    report_dir.mkdir(parents=True, exist_ok=True)
    log = Path(args.model) / "training_log.json"
    training_log = json.loads(log.read_text()) if log.is_file() else None
    report["plots"] = plot_report(report, task, names, logits, targets, report_dir, training_log)
    (report_dir / "report.json").write_text(json.dumps(report, indent=1))
    print(render(report))
    if args.calibrate:
        c = report["calibration"]
        print(
            f"calibrated: temperature {c['temperature']:.3f} folded into {args.model} (NLL {c['nll_before']:.4f} -> "
            f"{c['nll_after']:.4f}, ECE {c['ece_before']:.4f} -> {c['ece_after']:.4f})"
        )
    print(f"report: {report_dir / 'report.json'}" + ("" if report["plots"] else f" (no plots: {PLOTS_HINT})"))
    return 0


def render(report) -> str:
    """The report as a readable table."""
    lines = [f"{report['task']}, {report['examples']} examples"]
    for key in ("accuracy", "f1_macro", "f1_micro", "roc_auc", "ece", "mse", "mae", "pearson", "spearman"):
        if report.get(key) is not None:
            lines.append(f"  {key:10} {report[key]:.4f}")
    if "per_class" in report:
        lines.append(f"  {'label':20} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}")
        for name, row in report["per_class"].items():
            lines.append(
                f"  {name[:20]:20} {row['precision']:9.4f} {row['recall']:9.4f} {row['f1']:9.4f} {row['support']:8d}"
            )
    if report["task"] == "single_label_classification":
        lines.append("  confusion matrix (rows: true, columns: predicted)")
        lines += ["    " + " ".join(f"{n:6d}" for n in row) for row in report["confusion_matrix"]]
    return "\n".join(lines)


def predict(args) -> int:
    output = Path(args.output)
    if output.suffix not in (".jsonl", ".csv"):
        raise CliError(f"--output {output}: use a .jsonl or .csv file")
    if output.exists() and not args.overwrite:
        raise CliError(f"--output {output} exists; pass --overwrite or another file")
    model, tokenizer = load_classifier(args.model)
    task = model.config.problem_type or "single_label_classification"
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    rows = read_rows(args.data)
    texts, pairs = texts_of(rows, args, args.data)
    logits = forward_in_length_order(model, tokenizer, texts, pairs, args.batch_size)
    probs = probabilities(logits, task)
    thresholds = getattr(model.config, "multi_label_thresholds", None) or [0.5] * len(names)
    results = []
    for text, row in zip(texts, probs.tolist(), strict=True):
        if task == "regression":
            results.append({"text": text, "score": row[0]})
        elif task == "single_label_classification":
            best = max(range(len(row)), key=row.__getitem__)
            results.append(
                {
                    "text": text,
                    "label": names[best],
                    "score": row[best],
                    "probabilities": dict(zip(names, row, strict=True)),
                }
            )
        else:
            chosen = [n for n, p, cut in zip(names, row, thresholds, strict=True) if p >= cut]
            results.append({"text": text, "labels": chosen, "probabilities": dict(zip(names, row, strict=True))})
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".jsonl":
        output.write_text("".join(json.dumps(r) + "\n" for r in results))
    else:
        import pandas

        flat = [
            {
                **{k: (";".join(v) if isinstance(v, list) else v) for k, v in r.items() if k != "probabilities"},
                **{f"p_{n}": p for n, p in r.get("probabilities", {}).items()},
            }
            for r in results
        ]
        pandas.DataFrame(flat).to_csv(output, index=False)
    print(f"predict: {len(results)} rows -> {output}")
    return 0


# ---------------------------------------------------------------- arguments


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="stable-models", description=__doc__, formatter_class=HelpFormatter)
    commands = top.add_subparsers(dest="command", metavar="{train,evaluate,predict,doctor}")

    def data_keys(sub):
        sub.add_argument("--text-key", default="text", help="the column with the text")
        sub.add_argument("--text-pair-key", help="the column with the second text (rerankers, pair classification)")

    t = commands.add_parser("train", help="fine-tune a classifier", formatter_class=HelpFormatter)
    t.add_argument("--config", help="a YAML or JSON file with any of these options (the command line wins)")
    t.add_argument("--model", help="a causal LM or classifier folder (or its folder, with --gguf-file)")
    t.add_argument("--gguf-file", help="a GGUF file inside --model to load the weights from")
    t.add_argument("--train", help="CSV, TSV, JSON lines, JSON, Parquet, or a datasets.save_to_disk folder")
    t.add_argument("--eval", help="an eval file in the same formats (default: --eval-fraction of --train)")
    t.add_argument("--eval-fraction", type=float, default=0.1, help="held out of --train when no --eval is given")
    data_keys(t)
    t.add_argument(
        "--label-key",
        default="label",
        help="the label column: strings or integers mean single-label, lists multi-label, floats regression",
    )
    t.add_argument("--output", help="the directory for the trained model (refused when not empty)")
    t.add_argument("--overwrite", action="store_true", help="write into a non-empty --output")
    t.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output")
    t.add_argument("--epochs", type=float, default=1.0, help="passes over the training data")
    t.add_argument("--max-steps", type=int, help="optimizer steps (overrides --epochs)")
    t.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    t.add_argument("--qlora", action="store_true", help="4-bit base weights with LoRA (needs bitsandbytes)")
    t.add_argument("--lora-r", type=int, default=16, help="LoRA rank (alpha = 2 x rank) on every decoder linear")
    t.add_argument("--lr", type=float, help="learning rate (default: 2e-4 with LoRA, 2e-5 full)")
    t.add_argument("--batch-size", type=int, default=8, help="examples per micro-batch")
    t.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps (exact: StableTrainer)")
    t.add_argument("--max-length", type=int, help="truncate texts to N tokens (default: the longest in the data)")
    t.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"], help="auto: bf16 where it is fast")
    t.add_argument("--pooling", default="last", choices=["last", "mean"], help="how a text becomes one vector")
    t.add_argument("--no-packing", action="store_true", help="pad instead of packing (recurrent models always pad)")
    t.add_argument("--class-weights", help="'balanced' or one weight per label, comma-separated (single-label)")
    t.add_argument("--label-smoothing", type=float, default=0.0, help="single-label cross-entropy smoothing")
    t.add_argument("--pos-weight", help="one positive weight per label, comma-separated (multi-label)")
    t.add_argument("--eval-steps", type=int, help="evaluate and save every N steps (default: 5 times per run)")
    t.add_argument(
        "--early-stopping", type=int, default=3, help="stop after N evaluations without improvement (0: off)"
    )
    t.add_argument("--seed", type=int, default=42, help="random seed (data split, head init, order)")

    e = commands.add_parser(
        "evaluate", help="metrics, calibration and plots on labelled data", formatter_class=HelpFormatter
    )
    e.add_argument("--config", help="a YAML or JSON file with any of these options")
    e.add_argument("--model", help="a classifier folder (from train)")
    e.add_argument("--data", help="labelled data, same formats as train")
    data_keys(e)
    e.add_argument("--label-key", default="label", help="the label column")
    e.add_argument("--calibrate", action="store_true", help="fit a temperature (and multi-label thresholds), save them")
    e.add_argument("--report-dir", help="where report.json and the plots go (default: MODEL/evaluation)")
    e.add_argument("--batch-size", type=int, default=16, help="texts per forward")

    p = commands.add_parser("predict", help="score a file into JSON lines or CSV", formatter_class=HelpFormatter)
    p.add_argument("--config", help="a YAML or JSON file with any of these options")
    p.add_argument("--model", help="a classifier folder (from train)")
    p.add_argument("--data", help="texts to score, same formats as train")
    data_keys(p)
    p.add_argument("--output", help="a .jsonl or .csv file (refused when it exists)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--batch-size", type=int, default=16, help="texts per forward")
    commands.add_parser("doctor", help="explain NaN / wrong results of a checkpoint (doctor --help)", add_help=False)
    return top


REQUIRED = {
    "train": ("model", "train", "output"),
    "evaluate": ("model", "data"),
    "predict": ("model", "data", "output"),
}


def parse(argv) -> argparse.Namespace:
    top = parser()
    args = top.parse_args(argv)
    if args.command is None:
        top.print_help()
        raise SystemExit(2)
    if getattr(args, "config", None):
        sub = top._subparsers._group_actions[0].choices[args.command]
        known = {a.dest for a in sub._actions} - {"help", "config"}
        options = read_options(args.config)
        unknown = sorted(set(options) - known)
        if unknown:
            raise CliError(f"--config {args.config}: unknown options {unknown}; known: {sorted(known)}")
        sub.set_defaults(**options)
        args = top.parse_args(argv)
    missing = [name for name in REQUIRED[args.command] if getattr(args, name) in (None, "")]
    if missing:
        raise CliError(f"{args.command} needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
    return args


def read_options(path) -> dict:
    source = Path(path)
    if not source.is_file():
        raise CliError(f"--config {path}: no such file")
    text = source.read_text()
    try:
        if source.suffix in (".yaml", ".yml"):
            import yaml

            options = yaml.safe_load(text)
        else:
            options = json.loads(text)
    except Exception as error:
        raise CliError(f"--config {path}: cannot be read ({str(error).splitlines()[0]})") from None
    if not isinstance(options, dict):
        raise CliError(f"--config {path}: must hold a mapping of option names to values")
    return {key.replace("-", "_"): value for key, value in options.items()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["doctor"]:
        from .doctor import main as doctor

        return doctor(argv[1:])
    try:
        args = parse(argv)
        return {"train": train, "evaluate": evaluate, "predict": predict}[args.command](args)
    except CliError as error:
        print(f"stable-models: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
