"""Stop training at the first non-finite loss or gradient, and say where it came from.

Trainer's default `logging_nan_inf_filter` logs a NaN step as `'loss': 0.0` and carries on; the optimizer then
writes NaN into the weights and every later checkpoint. `NonFiniteGuard` checks before the optimizer step, so the
weights (and any checkpoint) stay finite, and its error names the step, the batch and the first module whose output
was non-finite.
"""

import torch
from transformers import TrainerCallback


class NonFiniteError(RuntimeError):
    """Raised at the first non-finite loss or gradient; training stops before the optimizer step."""


def describe_batch(batch: dict, model=None) -> str:
    """Lengths, padding side and dtype of a batch, for error messages."""
    mask = batch.get("attention_mask")
    tokens = batch.get("input_ids", batch.get("inputs_embeds"))
    parts = []
    if mask is not None and mask.dim() == 2:
        real = mask != 0
        lengths = real.sum(-1).tolist()
        left, right = (~real[:, 0]).any().item(), (~real[:, -1]).any().item()
        side = "left" if left and not right else "right" if right and not left else "mixed" if left else "none"
        parts += [f"lengths {lengths}", f"padding {side}"]
    elif tokens is not None:
        parts.append(f"shape {tuple(tokens.shape)}, no attention_mask")
    if model is not None:
        parts.append(f"dtype {next(model.parameters()).dtype}")
    return ", ".join(parts)


def _non_finite(output) -> bool:
    """Whether a module output (a tensor, a tuple, or a ModelOutput/dict) holds a non-finite float."""
    if torch.is_tensor(output):
        items = [output]
    else:
        items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else []
    return any(torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all() for t in items)


def first_non_finite_module(model, batch: dict) -> str | None:
    """Re-run the forward on `batch` and return the name of the first module whose output is non-finite."""
    found = []

    def hook(name):
        def record(module, args, output):
            if not found and _non_finite(output):
                found.append(name)

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            model(**{k: v for k, v in batch.items() if k != "labels"})
    except Exception:  # the diagnosis must not hide the original problem
        pass
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


class NonFiniteGuard:
    """For custom loops: `guard.check_loss(loss, batch, step)` after forward, `guard.check_gradients(step)` after
    backward (before `optimizer.step()`)."""

    def __init__(self, model):
        self.model = model
        self.last_batch = None

    def check_loss(self, loss, batch: dict, step: int) -> None:
        self.last_batch = batch
        if loss is not None and not torch.isfinite(loss).all():
            self._fail(f"loss is {loss.detach().float().item()}", batch, step)

    def check_gradients(self, step: int) -> None:
        for name, param in self.model.named_parameters():
            if param.grad is not None and not torch.isfinite(param.grad).all():
                self._fail(f"the gradient of {name} is not finite", self.last_batch, step)

    def _fail(self, what: str, batch, step: int):
        where = first_non_finite_module(self.model, batch) if batch is not None else None
        origin = f"first non-finite output: {where}" if where else "every module output was finite (backward)"
        details = describe_batch(batch, self.model) if batch is not None else "batch unknown"
        raise NonFiniteError(
            f"step {step}: {what}; {origin}; batch: {details}. Training stopped before the optimizer step, so the "
            "weights and checkpoints are still finite. Common causes: fp16 overflow (use bf16), a learning rate that "
            "is too high, a fully masked row (Stable classes prevent it), bad data in this batch."
        )


class StopOnNonFinite(TrainerCallback):
    """`Trainer(..., callbacks=[StopOnNonFinite()])`: raise NonFiniteError at the first non-finite loss or gradient."""

    def __init__(self):
        self.guard = None
        self.state = None
        self._handle = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.guard, self.state = NonFiniteGuard(model), state
        self._handle = model.register_forward_hook(self._after_forward, with_kwargs=True)

    def _after_forward(self, module, args, kwargs, output):
        if module.training and torch.is_grad_enabled():
            loss = output.get("loss") if isinstance(output, dict) else None
            self.guard.check_loss(loss, kwargs, self.state.global_step + 1)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.guard.check_gradients(state.global_step + 1)

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
