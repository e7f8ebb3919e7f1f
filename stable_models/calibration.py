"""Metrics and calibration of a classifier's logits, usable without the CLI: the evaluation report (scikit-learn
scores, confusion matrix, ECE, or regression errors and correlations), temperature scaling folded into the `score`
head, and per-class multi-label thresholds. `calibrate(model, tokenizer, texts, labels)` does it on held-out data.
"""

import os
import shutil
from pathlib import Path

import torch

from .data import encode_labels

TEMPERATURE_RANGE = (0.05, 20.0)


SCORING_CHUNK = 4_096  # rows tokenized and sorted by length at a time when scoring a table


@torch.no_grad()
def logits_in_length_order(model, tokenizer, ids, batch_size=16, progress=None):
    """Logits of token-id lists in their order, computed on batches of similar length (less padding, same logits)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    logits = [None] * len(ids)
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in chosen]}, return_tensors="pt")
        out = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
        for row, i in enumerate(chosen):
            logits[i] = out[row]
        if progress is not None:
            progress.update(len(chosen))
    return torch.stack(logits)


def forward_in_length_order(model, tokenizer, texts, pairs, batch_size=16, progress=True):
    """Logits of every text in input order, computed on batches of similar length (less padding, same logits)."""
    from tqdm.auto import tqdm

    encoded = tokenizer(texts, pairs, truncation=True) if pairs is not None else tokenizer(texts, truncation=True)
    with tqdm(total=len(texts), desc="scoring", disable=not progress, unit="row") as bar:
        return logits_in_length_order(model, tokenizer, encoded["input_ids"], batch_size, bar)


def stream_logits(model, tokenizer, table, text_key, pair_key, rows: range, batch_size=16, progress=True):
    """(texts, logits) for `rows` of a datasets table, SCORING_CHUNK rows at a time, in row order: memory stays flat
    in the number of rows."""
    from tqdm.auto import tqdm

    from .data import tokenized_chunks

    part = table.select(rows) if len(rows) != len(table) else table
    with tqdm(total=len(part), desc="scoring", disable=not progress, unit="row") as bar:
        for texts, ids in tokenized_chunks(tokenizer, part, text_key, pair_key, SCORING_CHUNK):
            yield texts, logits_in_length_order(model, tokenizer, ids, batch_size, bar)


def probabilities(logits, task):
    if task == "single_label_classification":
        return logits.softmax(-1)
    if task == "multi_label_classification":
        return logits.sigmoid()
    return logits


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
    """Per class, the probability cut that maximises that class's F1 on the eval set (0.5 where it has no positives),
    placed halfway between the lowest probability it keeps and the next lower one."""
    probs, targets = torch.as_tensor(probs), torch.as_tensor(targets, dtype=torch.float64)
    cuts = []
    for c in range(probs.shape[1]):
        if targets[:, c].sum() == 0:
            cuts.append(0.5)
            continue
        best, best_f1 = 0.5, -1.0
        values = sorted(set(probs[:, c].tolist()))
        for below, cut in zip([0.0, *values], values, strict=False):
            predicted = (probs[:, c] >= cut).double()
            true_positive = (predicted * targets[:, c]).sum().item()
            f1 = 2 * true_positive / (predicted.sum().item() + targets[:, c].sum().item())
            if f1 > best_f1:  # halfway to the next lower probability: rounding cannot move a row across the cut
                best, best_f1 = (below + cut) / 2, f1
        cuts.append(float(best))
    return cuts


def fold_temperature(model, temperature: float) -> None:
    """Divide the `score` head by `temperature`, so the model's own logits come out calibrated (and served so), and
    record the product of every temperature folded in as `config.calibration_temperature`."""
    head = model.score
    with torch.no_grad():
        head.weight.div_(temperature)
        if head.bias is not None:
            head.bias.div_(temperature)
    model.config.calibration_temperature = getattr(model.config, "calibration_temperature", 1.0) * temperature


def calibrate_logits(model, logits, targets, task) -> tuple[dict, torch.Tensor]:
    """Fit a temperature to held-out logits and their targets (class ids, or 0/1 rows for multi-label), fold it into
    the model's head and, for multi-label, set per-class thresholds in its config. Returns (what was fitted, with the
    NLL and ECE before and after; the calibrated logits)."""
    if task == "regression":
        raise ValueError("calibration applies to classification; this model is a regression")
    temperature = fit_temperature(logits, targets, task)
    fitted = {
        "temperature": temperature,
        "nll_before": negative_log_likelihood(logits, targets, task),
        "ece_before": expected_calibration_error(*calibration_points(logits, targets, task)),
    }
    fold_temperature(model, temperature)
    logits = torch.as_tensor(logits) / temperature
    fitted["nll_after"] = negative_log_likelihood(logits, targets, task)
    if task == "multi_label_classification":
        thresholds = fit_thresholds(probabilities(logits, task), targets)
        model.config.multi_label_thresholds = thresholds
        names = [model.config.id2label[i] for i in range(model.config.num_labels)]
        fitted["thresholds"] = dict(zip(names, thresholds, strict=True))
    fitted["ece_after"] = expected_calibration_error(*calibration_points(logits, targets, task))
    return fitted, logits


def save_in_place(model, folder: Path) -> None:
    """Save next to `folder`, then swap the files in, so an interrupted save leaves the old checkpoint whole."""
    staging = folder / ".stable-models-saving"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    for item in staging.iterdir():
        if item.name != "README.md":
            os.replace(item, folder / item.name)
    shutil.rmtree(staging, ignore_errors=True)


def calibrate(model, tokenizer, texts, labels, pairs=None, batch_size=16) -> dict:
    """Calibrate a classifier on held-out texts and labels (label names or ids; for multi-label, lists of them), in
    place: the temperature goes into `model.score`, thresholds into `model.config`. Save the model afterwards to keep
    them. Returns the temperature, NLL and ECE before and after (and the thresholds)."""
    task = model.config.problem_type or "single_label_classification"

    def name(label):
        return model.config.id2label[label] if isinstance(label, int) else str(label)

    named = [[name(v) for v in label] if isinstance(label, (list, tuple)) else name(label) for label in labels]
    targets = encode_labels(named, task, model.config.label2id, "calibrate(labels=...)")
    was_training = model.training
    logits = forward_in_length_order(model.eval(), tokenizer, texts, pairs, batch_size, progress=False)
    model.train(was_training)
    return calibrate_logits(model, logits, targets, task)[0]


# RewardBench (v1): its subsets, weighted by their example counts within a section (math-prm counted as 984, as
# RewardBench upweights it to equal the code subsets); the score is the mean of the sections
REWARDBENCH_SECTIONS = {
    "Chat": {
        "alpacaeval-easy": 100,
        "alpacaeval-length": 95,
        "alpacaeval-hard": 95,
        "mt-bench-easy": 28,
        "mt-bench-med": 40,
    },
    "Chat Hard": {
        "mt-bench-hard": 37,
        "llmbar-natural": 100,
        "llmbar-adver-neighbor": 134,
        "llmbar-adver-GPTInst": 92,
        "llmbar-adver-GPTOut": 47,
        "llmbar-adver-manual": 46,
    },
    "Safety": {
        "refusals-dangerous": 100,
        "refusals-offensive": 100,
        "xstest-should-refuse": 154,
        "xstest-should-respond": 250,
        "donotanswer": 136,
    },
    "Reasoning": {
        "math-prm": 984,
        "hep-cpp": 164,
        "hep-go": 164,
        "hep-java": 164,
        "hep-js": 164,
        "hep-python": 164,
        "hep-rust": 164,
    },
}


def pair_logits(chosen, rejected) -> torch.Tensor:
    """A pair as a two-class problem, class 1 = chosen preferred: softmax gives sigmoid(r_chosen - r_rejected), and
    the classification ECE, temperature fit and reliability diagram apply as they are."""
    return torch.stack([torch.as_tensor(rejected), torch.as_tensor(chosen)], -1).double()


def pairwise_metrics(chosen, rejected, subsets=None) -> dict:
    """Pairwise accuracy (a tie counts as wrong, as in TRL and RewardBench), the reward margin's mean and spread, the
    ECE of sigmoid(r_chosen - r_rejected); with `subsets`, accuracy per subset and RewardBench's section scores
    where the subset names match."""
    chosen, rejected = torch.as_tensor(chosen).double(), torch.as_tensor(rejected).double()
    margin = chosen - rejected
    logits = pair_logits(chosen, rejected)
    report = {
        "pairs": len(margin),
        "accuracy": (margin > 0).double().mean().item(),
        "margin_mean": margin.mean().item(),
        "margin_std": margin.std().item() if len(margin) > 1 else 0.0,
        "ece": expected_calibration_error(
            *calibration_points(logits, torch.ones(len(margin)), "single_label_classification")
        ),
        "reward_chosen_mean": chosen.mean().item(),
        "reward_rejected_mean": rejected.mean().item(),
        "ties": int((margin == 0).sum()),
    }
    if subsets is not None:
        correct: dict = {}
        for name, right in zip(subsets, (margin > 0).tolist(), strict=True):
            correct.setdefault(str(name), []).append(right)
        report["per_subset"] = {n: {"accuracy": sum(c) / len(c), "pairs": len(c)} for n, c in sorted(correct.items())}
        sections = {}
        for section, counts in REWARDBENCH_SECTIONS.items():
            present = [s for s in counts if s in report["per_subset"]]
            if present:
                weight = sum(counts[s] for s in present)
                sections[section] = sum(report["per_subset"][s]["accuracy"] * counts[s] for s in present) / weight
        if sections:
            report["rewardbench_sections"] = sections
            report["rewardbench_score"] = sum(sections.values()) / len(sections)
    return report
