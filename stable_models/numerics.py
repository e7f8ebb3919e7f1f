"""One check of a classifier's numerics at the cost of about one training step, shared by `stable-models train`'s
pre-flight and `python -m stable_models doctor`: finite loss, logits and gradients; logits that do not depend on how
the rows are padded; an fp32 loss that honours `num_items_in_batch` (gradient accumulation scales right)."""

from dataclasses import dataclass

import torch

# how far padding may move a logit, per dtype, times max(1, |logit|): the kernels' rounding, not a padding leak
PADDING_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 8 * 2**-7, torch.float16: 8 * 2**-10}


@dataclass
class Numerics:
    finite: bool  # loss, logits and the gradients of what trains
    loss: float  # the batch's mean loss
    loss_dtype: torch.dtype
    padding_error: float  # the largest logit difference between the batch and the same rows padded otherwise
    logit_scale: float  # the largest |logit|: the padding tolerance scales with it
    honours_num_items: bool  # a loss given twice the item count is half the default one
    unused: list  # trainable parameters that got no gradient
    first_non_finite: str | None  # the first module whose output is not finite, where something is not

    def padding_tolerance(self, dtype) -> float:
        return PADDING_TOLERANCE[dtype] * max(1.0, self.logit_scale)

    def problems(self, dtype) -> dict[str, str]:
        """{check: what breaks the contract}, judged here once for a model in `dtype` (checks: finite, padding, loss
        dtype, num_items): train's pre-flight stops on the first, the doctor fails each. Where something is not
        finite, nothing else is judged."""
        if not self.finite:
            return {"finite": f"non-finite loss, logits or gradients (first at {self.first_non_finite})"}
        found = {}
        if self.padding_error > (tolerance := self.padding_tolerance(dtype)):
            found["padding"] = f"left and right padding give logits {self.padding_error:.2e} apart (> {tolerance:.1e})"
        if self.loss_dtype != torch.float32:
            found["loss dtype"] = f"the loss is in {self.loss_dtype}, not fp32"
        if not self.honours_num_items:
            found["num_items"] = "the loss ignores num_items_in_batch (gradient accumulation would scale it)"
        return found


def check_numerics(model, batch: dict, labels, others: list) -> Numerics:
    """One forward and backward of `batch` (in eval mode: no dropout, so the forwards compare), its loss given twice
    the item count; then, without gradients, the same rows as `others`, (inputs, labels) pairs: the other padding
    side, or each row alone. Their logits, concatenated, should be the batch's, and their loss (the item-weighted
    mean) twice the first one. Leaves the weights, the gradients (none) and the train / eval mode as they were."""
    was_training = model.training
    model.eval()
    try:
        halved = model(**batch, labels=labels, num_items_in_batch=2 * labels.numel())
        halved.loss.backward()
        trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
        gradients_finite = all(torch.isfinite(p.grad).all() for p in trained.values() if p.grad is not None)
        unused = [name for name, p in trained.items() if p.grad is None]
        with torch.no_grad():
            outputs = [(model(**inputs, labels=part), part.numel()) for inputs, part in others]
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    compared = torch.cat([output.logits.float() for output, _ in outputs])
    full = sum(output.loss.float() * count for output, count in outputs) / sum(count for _, count in outputs)
    logits = halved.logits.detach().float()
    finite = bool(torch.isfinite(logits).all() and torch.isfinite(full) and gradients_finite)
    where = None
    if not finite:
        from .guards import first_non_finite_module  # pulls in transformers' Trainer: only when it is needed

        where = first_non_finite_module(model, batch) or "?"
        where = where.removeprefix("base_model.model.").removesuffix(".base_layer")  # peft's wrappers
    return Numerics(
        finite=finite,
        loss=full.item(),
        loss_dtype=halved.loss.dtype,
        padding_error=(logits - compared).abs().max().item(),
        logit_scale=compared.abs().max().item(),
        honours_num_items=bool(torch.isclose(2 * halved.loss.detach().float(), full, rtol=1e-3)),
        unused=unused,
        first_non_finite=where,
    )
