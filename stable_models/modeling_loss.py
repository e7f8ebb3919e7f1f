"""The fp32 classifier path: the `score` head (`Fp32Linear`), the loss options and the loss for regression,
single- and multi-label classification, exact under gradient accumulation (`num_items_in_batch`).

Part of the core copied next to a checkpoint.
"""

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .modeling_checks import user_stacklevel
from .modeling_pooling import at_least_fp32


class Fp32Linear(nn.Linear):
    """Classifier head that computes in (at least) fp32 and keeps fp32 weights through `.to(bf16)`, `.half()` and
    autocast; an fp64 model keeps an fp64 head.

    A bf16 head rounds logits to 8 significant bits: at a logit margin of 10 the loss reads exactly 0.0 (true 9e-5).
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = at_least_fp32(torch.promote_types(hidden.dtype, self.weight.dtype))
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.to(dtype)
            return F.linear(hidden.to(dtype), self.weight.to(dtype), bias)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for param in self.parameters(recurse=False):
            if param.is_floating_point() and at_least_fp32(param.dtype) != param.dtype:
                param.data = param.data.float()
        return self


LOSS_OPTIONS = ("class_weights", "label_smoothing", "pos_weight")  # constructor arguments, saved in config.json


WEIGHTED_BY_COUNT = (
    "{name}: class_weights under gradient accumulation or several processes need the total class weight of the whole "
    "batch, and transformers' Trainer passes only its label count: each micro-batch's loss is its own weighted mean, "
    "scaled by its share of the labels (close, not exact). stable_models.StableTrainer passes the total "
    "(label_weight_total), which makes the loss equal to F.cross_entropy(weight=...) on the one big batch."
)


def checked_loss_options(config, class_weights=None, label_smoothing=None, pos_weight=None) -> dict:
    """The loss options (arguments first, then config.json), checked: one finite, non-negative weight per label."""
    given = {"class_weights": class_weights, "label_smoothing": label_smoothing, "pos_weight": pos_weight}
    options = {k: v if v is not None else getattr(config, k, None) for k, v in given.items()}
    for name in ("class_weights", "pos_weight"):
        value = options[name]
        if value is None:
            continue
        weights = [float(w) for w in (value.tolist() if torch.is_tensor(value) else value)]
        if len(weights) != config.num_labels:
            raise ValueError(
                f"{name} has {len(weights)} values for num_labels={config.num_labels}: give one weight per label, in "
                "label-id order (config.id2label)."
            )
        if not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
            raise ValueError(f"{name}={weights}: every weight must be finite and >= 0, and not all of them 0.")
        options[name] = weights
    smoothing = options["label_smoothing"]
    if smoothing is not None:
        if not (isinstance(smoothing, (int, float)) and 0.0 <= float(smoothing) < 1.0):
            raise ValueError(f"label_smoothing={smoothing!r} must be a number in [0, 1) (0.1 is common).")
        options["label_smoothing"] = float(smoothing)
    return options


def sequence_classification_loss(logits, labels, config, num_items_in_batch=None, label_weight_total=None, model=None):
    """fp32 loss for regression, single- and multi-label classification, as the stock class picks them, with the
    optional `class_weights` / `label_smoothing` (single-label) and `pos_weight` (multi-label) from the config.

    With `num_items_in_batch` (Trainer with gradient accumulation) the loss is a sum divided by the number of labels
    in the whole accumulated batch, so micro-batches add up to the loss of one big batch. With class weights the
    divisor of the big batch is the total weight of its labels, `label_weight_total` (StableTrainer passes it).
    """
    logits = logits.to(at_least_fp32(logits.dtype))
    labels = labels.to(logits.device)
    problem_type = config.problem_type or infer_problem_type(labels, config.num_labels)
    if problem_type == "multi_label_classification" and labels.shape != logits.shape:
        raise ValueError(
            f"multi_label_classification needs labels of shape {tuple(logits.shape)} (one 0/1 target per class), "
            f"got {tuple(labels.shape)}. For one class id per row pass integer labels and set "
            "config.problem_type='single_label_classification'."
        )
    class_weights, smoothing, pos_weight = (getattr(config, name, None) for name in LOSS_OPTIONS)
    refuse_loss_options(problem_type, class_weights, smoothing, pos_weight)
    reduction = "mean" if num_items_in_batch is None else "sum"
    if problem_type == "regression":
        if config.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype), reduction=reduction)
        else:
            loss = F.mse_loss(logits, labels.to(logits.dtype), reduction=reduction)
    elif problem_type == "single_label_classification":
        logits, labels = logits.view(-1, config.num_labels), labels.view(-1).long()
        weight = None
        if class_weights is not None:
            weight = torch.tensor(class_weights, dtype=logits.dtype, device=logits.device)
            if num_items_in_batch is not None:  # the divisor of a weighted mean is the batch's total label weight
                num_items_in_batch = weighted_divisor(
                    labels, class_weights, num_items_in_batch, label_weight_total, model
                )
        loss = F.cross_entropy(logits, labels, weight=weight, label_smoothing=smoothing or 0.0, reduction=reduction)
    else:
        weight = None if pos_weight is None else torch.tensor(pos_weight, dtype=logits.dtype, device=logits.device)
        loss = F.binary_cross_entropy_with_logits(
            logits, labels.to(logits.dtype), pos_weight=weight, reduction=reduction
        )
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    config.problem_type = problem_type  # as the stock class does, but only once the labels fit it
    return loss


def refuse_loss_options(problem_type: str, class_weights, smoothing, pos_weight) -> None:
    """A loss option of another problem type is a ValueError, not silently ignored."""
    for name, value, fits in (
        ("class_weights", class_weights, "single_label_classification"),
        ("label_smoothing", smoothing or None, "single_label_classification"),
        ("pos_weight", pos_weight, "multi_label_classification"),
    ):
        if value is not None and problem_type != fits:
            raise ValueError(f"{name} applies to {fits} only; this batch is {problem_type}. Unset {name}.")


def weighted_divisor(labels, class_weights, num_items_in_batch, label_weight_total, model):
    """What a class-weighted summed loss divides by under gradient accumulation: the accumulated batch's total label
    weight (`label_weight_total`, which StableTrainer passes), or else this micro-batch's weight scaled up to
    Trainer's label count (exact only when every micro-batch weighs alike: warned once)."""
    if label_weight_total is not None:
        return label_weight_total
    local = int((labels != -100).sum())
    if local != int(num_items_in_batch) and not getattr(model, "_warned_weighted_by_count", True):
        model._warned_weighted_by_count = True
        message = WEIGHTED_BY_COUNT.format(name=type(model).__name__)
        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
    mine = total_class_weight(labels, class_weights)
    return mine * num_items_in_batch / local if local and mine else num_items_in_batch


def total_class_weight(labels, class_weights):
    """The divisor of a weighted mean cross-entropy: the class weights of the labels (ignored ones, -100, left out)."""
    labels = labels.view(-1).long()
    kept = labels[labels != -100]
    return torch.tensor(class_weights, dtype=torch.float32, device=labels.device)[kept].sum()


def infer_problem_type(labels, num_labels: int) -> str:
    """The stock class's rule, with integer labels of any width as class ids and a clear error where float labels
    of shape (batch,) leave it ambiguous (class ids stored as floats, or a regression on several outputs)."""
    if num_labels == 1:
        return "regression"
    if not labels.is_floating_point():
        return "single_label_classification"
    if labels.dim() == 2 and labels.shape[1] == num_labels:
        return "multi_label_classification"
    raise ValueError(
        f"float labels of shape {tuple(labels.shape)} with num_labels={num_labels}: for single-label classification "
        "pass integer class ids (labels.long()); for multi_label_classification pass 0/1 floats of shape "
        f"(batch, {num_labels}); for regression on {num_labels} outputs pass floats of shape (batch, {num_labels}) and "
        "set config.problem_type='regression'. Or set config.problem_type explicitly to one of "
        "'single_label_classification', 'multi_label_classification', 'regression'."
    )
