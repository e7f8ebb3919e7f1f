"""`python -m stable_models doctor --log FILE`: explain what a Trainer log shows, each finding with its fix.

Reads `trainer_state.json` (its `log_history`) or a text log holding the dicts Trainer prints
(`{'loss': '2.11', 'grad_norm': '11.47', ...}`). Exit code 0 when nothing is wrong, 1 otherwise.
"""

import ast
import json
import math
import os
import re

import torch

from .errors import CliError


class LogError(CliError):
    """A log that cannot be read: the command line's one-line error, no traceback."""


DICT_PATTERN = re.compile(r"\{[^{}]*'loss'[^{}]*\}|\{[^{}]*\"loss\"[^{}]*\}")


def read_log(path: str) -> list[dict]:
    """The training steps of a log: dicts with a 'loss', values as floats where they are numbers."""
    if not os.path.isfile(path):
        raise LogError(f"--log {path}: no such file")
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    try:
        data = json.loads(text)
        entries = data.get("log_history", []) if isinstance(data, dict) else data
    except ValueError:
        entries, unreadable = [], []
        for match in DICT_PATTERN.finditer(text):
            try:
                entries.append(printed_dict(match.group(0)))
            except (ValueError, SyntaxError):
                unreadable.append(match.group(0))
        if unreadable:
            raise LogError(
                f"--log {path}: {len(unreadable)} of {len(entries) + len(unreadable)} logged dicts could not be read "
                f"(e.g. {unreadable[0][:120]}); pass trainer_state.json from the output or checkpoint folder instead"
            ) from None
    steps = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and "loss" in entry:
            steps.append({key: as_number(value) for key, value in entry.items()})
    if not steps:
        raise LogError(f"--log {path}: no logged training loss found (expected trainer_state.json or printed dicts)")
    return steps


# Bare names in printed dicts: transformers 4.x prints floats as Python reprs (`'grad_norm': nan`, `inf`), JSON-lines
# loggers write `NaN` / `Infinity` / `true` / `null`.
NAMES = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf}
NAMES |= {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def printed_dict(text: str) -> dict:
    """A dict as Trainer prints it (every transformers 4.57 to 5.24 form), read without evaluating code."""

    def value(node):
        if isinstance(node, ast.Name) and node.id in NAMES:
            return NAMES[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            number = value(node.operand)
            return -number if isinstance(node.op, ast.USub) else number
        if isinstance(node, ast.Dict):
            return {value(key): value(item) for key, item in zip(node.keys, node.values, strict=True)}
        return ast.literal_eval(node)

    return value(ast.parse(text.strip(), mode="eval").body)


def as_number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def on_bf16_grid(value: float) -> bool:
    return value == torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).item()


def guess_num_labels(loss: float) -> int | None:
    """k with loss ~ ln(k): what an untrained classifier (uniform logits) logs."""
    candidates = [k for k in range(2, 101) if abs(loss - math.log(k)) <= 0.02 * math.log(k)]
    return candidates[0] if candidates else None


def findings(steps: list[dict], num_labels: int | None) -> list[tuple[str, str]]:
    """(what the log shows, what to do) for every known failure pattern in it."""
    found = []
    losses = [s["loss"] for s in steps if isinstance(s["loss"], float)]
    norms = [s.get("grad_norm") for s in steps]
    hidden_nan = [
        int(s.get("step", i + 1))
        for i, s in enumerate(steps)
        if s["loss"] == 0.0 and isinstance(s.get("grad_norm"), float) and math.isnan(s["grad_norm"])
    ]
    if hidden_nan:
        found.append(
            (
                f"step {hidden_nan[0]}: loss 0.0 with grad_norm nan. The loss was NaN: Trainer's "
                "logging_nan_inf_filter (on by default) logs a non-finite step as 0.0, and AdamW then wrote NaN into "
                "the weights, so every later step and checkpoint is NaN too",
                "restore the last checkpoint saved before that step; train with "
                "callbacks=[stable_models.StopOnNonFinite()] (stops before the optimizer step) and a Stable class "
                "(no fully masked attention rows, fp32 head and loss); in fp16, switch to bf16",
            )
        )
    k = num_labels or (guess_num_labels(losses[0]) if losses else None)
    stuck = [
        s
        for s in steps
        if k and isinstance(s["loss"], float) and abs(s["loss"] - math.log(k)) <= 1e-3 and s.get("grad_norm") == 0.0
    ]
    if k and len(stuck) >= max(2, len(steps) // 2):
        found.append(
            (
                f"loss stuck at ln({k}) = {math.log(k):.4f} with grad_norm 0.0 in {len(stuck)} of {len(steps)} logged "
                "steps: the logits are uniform and no gradient flows",
                "check that the score head is trainable (peft: task_type='SEQ_CLS' keeps it in modules_to_save) and "
                "not all zero; that the labels are not all -100; that the learning rate is not 0; that the pooled "
                "token is a real one (padding side, pad == eos: a Stable class pools from attention_mask); that "
                "num_labels matches the data",
            )
        )
    distinct = {v for v in losses if v not in (0.0,) and math.isfinite(v)}
    if len(distinct) >= 3 and all(on_bf16_grid(v) for v in distinct):
        found.append(
            (
                f"all {len(distinct)} distinct losses lie on the bf16 grid (e.g. {sorted(distinct)[0]:g}): the loss "
                "is computed in bf16, which rounds it to 8 significant bits and reads 0.0 once the model is confident",
                "use a Stable class (fp32 head, logits and loss), or load in fp32 and train with bf16=True",
            )
        )
    if losses and k and losses[0] > 1.5 * math.log(k):
        ratio = losses[0] / math.log(k)
        if abs(ratio - round(ratio)) <= 0.1 * ratio and round(ratio) >= 2:
            found.append(
                (
                    f"the first logged loss {losses[0]:g} is {round(ratio)} x ln({k}), the loss of an untrained "
                    f"{k}-class head: the loss looks inflated {round(ratio)}x, as gradient_accumulation_steps="
                    f"{round(ratio)} or {round(ratio)} processes do when the loss ignores num_items_in_batch "
                    "(transformers#47688); the updates are inflated by the same factor",
                    "use a Stable class (its loss honours num_items_in_batch), or set "
                    "model.accepts_loss_kwargs = False before building the Trainer",
                )
            )
    if len(losses) >= 8:
        half = len(losses) // 2
        first, last = sum(losses[:half]) / half, sum(losses[half:]) / (len(losses) - half)
        spread = max(losses) - min(losses)
        moving = [n for n in norms if isinstance(n, float) and math.isfinite(n) and n > 0]
        if abs(first - last) <= 0.01 * max(abs(first), 1e-8) and spread <= 0.02 * max(abs(first), 1e-8) and moving:
            found.append(
                (
                    f"the loss is flat ({first:.4g} -> {last:.4g} over {len(losses)} logged steps) while gradients "
                    "flow (grad_norm > 0): updates are not changing the model. With bf16 weights (transformers 5 "
                    "loads a checkpoint's stored dtype, bf16 for most) AdamW updates below half a bf16 step round away",
                    "load with dtype=torch.float32 and train with TrainingArguments(bf16=True), or use LoRA; also "
                    "check the learning rate",
                )
            )
    return found


def explain_log(path: str, num_labels: int | None = None) -> int:
    steps = read_log(path)
    found = findings(steps, num_labels)
    losses = [s["loss"] for s in steps if isinstance(s["loss"], float)]
    print(f"stable_models doctor --log {path}: {len(steps)} logged steps, loss {losses[0]:g} -> {losses[-1]:g}")
    for what, fix in found:
        print(f"  FAIL  {what}\n        -> {fix}")
    if not found:
        print("  ok    none of the known failure patterns (hidden NaN, stuck at ln(k), bf16 loss, inflated, flat)")
    return 1 if found else 0
