"""Calibration of a classifier's logits, usable without the CLI: temperature scaling folded into the `score` head and
per-class multi-label thresholds. `calibrate(model, tokenizer, texts, labels)` does it on held-out data.
"""

import torch

from .labels import encode_labels
from .metrics import calibration_points, expected_calibration_error, pair_logits, probabilities
from .scoring import forward_in_length_order

TEMPERATURE_RANGE = (0.05, 20.0)


def negative_log_likelihood(logits, targets, problem_type) -> float:
    """What temperature scaling minimises (ECE is binned, so it may move either way by a little)."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    if problem_type == "single_label_classification":
        return torch.nn.functional.cross_entropy(logits, torch.as_tensor(targets, dtype=torch.long)).item()
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.as_tensor(targets).double()).item()


def fit_temperature(logits, targets, problem_type) -> float:
    """The temperature T (within TEMPERATURE_RANGE) that minimises the eval set's negative log-likelihood of
    logits / T."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    if problem_type == "single_label_classification":
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


def calibrate_logits(model, logits, targets, problem_type) -> tuple[dict, torch.Tensor]:
    """Fit a temperature to held-out logits and their targets (class ids, or 0/1 rows for multi-label), fold it into
    the model's head and, for multi-label, set per-class thresholds in its config. Returns (what was fitted, with the
    NLL and ECE before and after; the calibrated logits)."""
    if problem_type == "regression":
        raise ValueError("calibration applies to classification; this model is a regression")
    temperature = fit_temperature(logits, targets, problem_type)
    fitted = {
        "temperature": temperature,
        "nll_before": negative_log_likelihood(logits, targets, problem_type),
        "ece_before": expected_calibration_error(*calibration_points(logits, targets, problem_type)),
    }
    fold_temperature(model, temperature)
    logits = torch.as_tensor(logits) / temperature
    fitted["nll_after"] = negative_log_likelihood(logits, targets, problem_type)
    if problem_type == "multi_label_classification":
        thresholds = fit_thresholds(probabilities(logits, problem_type), targets)
        model.config.multi_label_thresholds = thresholds
        names = [model.config.id2label[i] for i in range(model.config.num_labels)]
        fitted["thresholds"] = dict(zip(names, thresholds, strict=True))
    fitted["ece_after"] = expected_calibration_error(*calibration_points(logits, targets, problem_type))
    return fitted, logits


def calibrate(model, tokenizer, texts, labels, pairs=None, batch_size=16) -> dict:
    """Calibrate a classifier on held-out texts and labels (label names or ids; for multi-label, lists of them), in
    place: the temperature goes into `model.score`, thresholds into `model.config`. Save the model afterwards to keep
    them. Returns the temperature, NLL and ECE before and after (and the thresholds)."""
    problem_type = model.config.problem_type or "single_label_classification"

    def name(label):
        return model.config.id2label[label] if isinstance(label, int) else str(label)

    named = [[name(v) for v in label] if isinstance(label, (list, tuple)) else name(label) for label in labels]
    targets = encode_labels(named, problem_type, model.config.label2id, "calibrate(labels=...)")
    was_training = model.training
    logits = forward_in_length_order(model.eval(), tokenizer, texts, pairs, batch_size, progress=False)
    model.train(was_training)
    return calibrate_logits(model, logits, targets, problem_type)[0]


def calibrate_pairwise(model, first, second, targets) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """`calibrate_logits` for scores compared in pairs: P(first above second) = sigmoid(first - second), a two-class
    problem (class 1 = first; a reward model's chosen over rejected, a reranker's score over 0). Returns (what was
    fitted, the calibrated first and second scores)."""
    fitted, calibrated = calibrate_logits(model, pair_logits(first, second), targets, "single_label_classification")
    return fitted, calibrated[:, 1], calibrated[:, 0]
