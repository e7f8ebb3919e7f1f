"""Input checks and once-per-model warnings: what would silently give NaN, garbage or a device-side assert becomes
a ValueError naming the problem and the fix; a warning points at the user's line, not at transformers' wrappers.

Part of the core copied next to a checkpoint.
"""

import importlib
import inspect
import os
import warnings

import torch


def _rows(flags: torch.Tensor) -> list[int]:
    return flags.nonzero().flatten().tolist()[:10]


def check_inputs(model, input_ids, attention_mask, inputs_embeds, labels, past_length=0) -> None:
    """Turn inputs that would silently give NaN, garbage or a device-side assert into a clear ValueError."""
    tokens = input_ids if input_ids is not None else inputs_embeds
    name, wanted = ("input_ids", 2) if input_ids is not None else ("inputs_embeds", 3)
    if tokens.dim() != wanted:
        raise ValueError(
            f"{name} has shape {tuple(tokens.shape)}: pass a {wanted}-D (batch, sequence{', hidden' * (wanted == 3)}) "
            f"tensor; for one text use {name}[None] or tokenizer(text, return_tensors='pt')."
        )
    if labels is not None and not torch.is_tensor(labels):
        raise ValueError(
            f"labels is a {type(labels).__name__}: pass a tensor, e.g. torch.tensor(labels) (class ids as integers, "
            "multi-label targets or regression values as floats)."
        )
    if attention_mask is not None:
        if not torch.is_tensor(attention_mask):
            raise ValueError(
                f"attention_mask is a {type(attention_mask).__name__}: pass a tensor (return_tensors='pt')."
            )
        if attention_mask.dim() != 2 or attention_mask.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the inputs have shape "
                f"{tuple(tokens.shape[:2])}: pass a 2D mask (batch, sequence) built by the same tokenizer call as the "
                "input_ids (tokenizer(..., padding=True, return_tensors='pt'))."
            )
        if attention_mask.shape[1] != past_length + tokens.shape[1]:
            cached = f"{past_length} cached + " if past_length else ""
            raise ValueError(
                f"attention_mask has {attention_mask.shape[1]} positions but the inputs have {tokens.shape[1]} "
                f"({cached or 'and there is no cache, so '}the mask must cover exactly "
                f"{past_length + tokens.shape[1]}): build the mask in the same tokenizer call as the input_ids, or "
                "cut it to their length."
            )
        if attention_mask.dtype != torch.bool and ((attention_mask != 0) & (attention_mask != 1)).any():
            raise ValueError(
                f"attention_mask holds values other than 0 and 1 (from {attention_mask.min().item():g} to "
                f"{attention_mask.max().item():g}): this looks like an additive mask (0 = attend, large negative = "
                "padding). Pass the tokenizer's mask instead: 1 for tokens, 0 for padding."
            )
        empty = ~(attention_mask[:, -tokens.shape[1] :] != 0).any(-1)
        if empty.any():
            raise ValueError(
                f"rows {_rows(empty)} of attention_mask are all zero: these rows have no token to classify. "
                "Drop empty texts before batching, or check that the mask is 1 on real tokens and 0 on padding."
            )
    if input_ids is not None:
        vocab = model.get_input_embeddings().num_embeddings
        bad = ((input_ids < 0) | (input_ids >= vocab)).any(-1)
        if bad.any():
            raise ValueError(
                f"rows {_rows(bad)} hold token ids outside the embedding table (size {vocab}; ids seen from "
                f"{int(input_ids.min())} to {int(input_ids.max())}). Use the tokenizer that belongs to this model, or "
                "call model.resize_token_embeddings(len(tokenizer)) after adding tokens."
            )
    if inputs_embeds is not None:
        bad = ~torch.isfinite(inputs_embeds).flatten(1).all(-1)
        if bad.any():
            raise ValueError(
                f"rows {_rows(bad)} of inputs_embeds contain NaN or inf. Check whatever produced the embeddings "
                "(a NaN upstream, or fp16 overflow: use bf16 or fp32)."
            )
    if (
        labels is not None
        and not labels.is_floating_point()
        and labels.dtype != torch.bool
        and model.config.num_labels > 1
    ):
        bad = ((labels < 0) | (labels >= model.config.num_labels)) & (labels != -100)
        if bad.any():
            raise ValueError(
                f"labels {sorted(set(labels[bad].tolist()))[:10]} are outside 0..{model.config.num_labels - 1} "
                f"(num_labels={model.config.num_labels}). Load the model with num_labels set to the number of classes, "
                "or map the labels to 0..num_labels-1 (-100 marks a row to ignore)."
            )


LIBRARY_PATHS = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(module.__file__))) + os.sep
    for module in (torch, importlib.import_module("transformers"))
) + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def user_stacklevel() -> int:
    """The `stacklevel` that makes a warning point at the first frame outside the installed packages (torch's and
    transformers' site-packages: also peft, accelerate, Trainer) and this file: the user's line, not transformers'
    output wrapper."""
    frame, level = inspect.currentframe().f_back, 1
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(LIBRARY_PATHS) and not path.startswith("<"):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def warn_if_padded_without_mask(model, input_ids) -> None:
    """Padded input_ids without attention_mask: Stable treats every position as content (contract point 1), while the
    stock class found the pads by id. Keep the contract, but say so once per model."""
    pad = model.config.get_text_config().pad_token_id
    if pad is None or input_ids.shape[0] < 2 or getattr(model, "_warned_unmasked_padding", False):
        return
    ends, starts = input_ids[:, -1] == pad, input_ids[:, 0] == pad
    if ends.any() or (starts.any() and not starts.all()):
        model._warned_unmasked_padding = True
        warnings.warn(
            f"rows {_rows(ends | starts)} of input_ids start or end in pad_token_id ({pad}) but no attention_mask was "
            "given: every position counts as content (padding included) in pooling and attention. If the batch is "
            "padded, pass attention_mask (tokenizer(..., padding=True, return_tensors='pt') returns it).",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def warn_if_longer_than_positions(model, length: int, position_ids, padding_mask) -> None:
    """Once per model: inputs past `max_position_embeddings` run silently (stock too) on positions the model never
    learned (or rotary angles it never saw). Padded and packed rows may be longer: their real positions count."""
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if not limit or length <= limit or getattr(model, "_warned_past_positions", False):
        return
    if position_ids is not None:
        longest = int(position_ids.max()) + 1
    else:
        longest = length if padding_mask is None else int(padding_mask.sum(-1).max())
    if longest > limit:
        model._warned_past_positions = True
        warnings.warn(
            f"input of {longest} positions is longer than this model's max_position_embeddings ({limit}): "
            "positions past it were never trained, so logits there are unreliable. Truncate the texts "
            f"(tokenizer(..., truncation=True, max_length={limit})).",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
