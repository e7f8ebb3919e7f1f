"""Self-contained core of stable_models: mask-driven pooling, an fp32 head and loss, safe attention masks.

This file is copied next to a saved checkpoint (remote code), so it imports only torch and transformers.
`Stable<Name>ForSequenceClassification` is `StableSequenceClassificationMixin` put before transformers'
`<Name>ForSequenceClassification`, built by name on first use (`stable_class`, module `__getattr__`). The mixin
replaces `forward`, makes the `score` head fp32, guards the mask every decoder layer receives, checks a local folder
in `from_pretrained` and adds a model card in `save_pretrained`; weights, attributes and outputs stay the stock ones.
"""

import functools
import importlib
import inspect
import json
import logging
import math
import os
import re
import struct
import sys
import typing
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from transformers.dynamic_module_utils import custom_object_save
from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.modeling_outputs import ModelOutput, SequenceClassifierOutputWithPast
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils.generic import TransformersKwargs, can_return_tuple

POOLING_MODES = ("last", "mean")
DEFAULT_POOLING = "last"


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


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


def position_ids_from_mask(padding_mask: torch.Tensor, query_length: int) -> torch.Tensor:
    """Real tokens get positions 0, 1, 2, ... whatever padding precedes them, so left padding changes nothing."""
    positions = padding_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)[:, -query_length:]


def with_self_attention(mask: torch.Tensor, past_length: int = 0) -> torch.Tensor:
    """Let every query attend to its own position in a 4D mask (bool: True = attend; float: 0 = attend).

    Query i sits at key position `past_length + i` (keys may run past the last query: transformers 4.57 pads some
    masks by a column). Real queries already attend to themselves (causal masks keep the diagonal), so only padding
    queries change: a padding key is never a real query's own position, so real tokens still never see padding.
    """
    queries, keys = mask.shape[-2:]
    own = torch.arange(queries, device=mask.device)[:, None] + past_length == torch.arange(keys, device=mask.device)
    if mask.dtype == torch.bool:
        if queries == 1:  # one query attends to its own key in either convention
            return mask
        # transformers' masks say True = attend; some backbones hand their layers True = masked (MPT). The first
        # query never sees the last key (causal), so that entry tells the convention, per row, without a sync.
        masked_is_true = mask[..., :1, -1:]
        return (mask | own) & ~(masked_is_true & own)  # True = masked: mask & ~own; else mask | own (no bool Where)
    # only masked entries (finfo.min or -inf) open up: a float mask may carry a bias too (MPT adds ALiBi to it)
    return mask.masked_fill(own & (mask <= torch.finfo(mask.dtype).min / 2), 0.0)


def block_mask_with_self_attention(mask, past_length: int = 0):
    """The same for a flex-attention BlockMask: rebuild it from its mask function, or'ed with the diagonal."""
    from torch.nn.attention.flex_attention import create_block_mask, or_masks

    queries, keys = mask.seq_lengths
    inner = mask.mask_mod

    def own_position(batch_idx, head_idx, q_idx, kv_idx):
        return q_idx + past_length == kv_idx

    return create_block_mask(
        or_masks(inner, own_position), mask.shape[0], None, queries, keys, device=mask.kv_num_blocks.device
    )


def safe_attention_mask(mask, past_length: int = 0):
    """What an attention layer may receive: masks with an empty query row get the diagonal; 2-D padding masks
    (recurrent and linear-attention layers, flash kernels) and None pass unchanged."""
    if isinstance(mask, torch.Tensor):
        return with_self_attention(mask, past_length) if mask.dim() == 4 else mask
    if type(mask).__name__ == "BlockMask":
        return block_mask_with_self_attention(mask, past_length)
    return mask


@functools.cache
def mask_position(layer_class) -> int | None:
    """Where `attention_mask` sits among a layer's positional arguments (None: it has none)."""
    names = list(inspect.signature(layer_class.forward).parameters)[1:]  # without self
    return names.index("attention_mask") if "attention_mask" in names else None


class LayerMaskGuard:
    """Forward pre-hook on every decoder layer: the layer gets the mask the backbone chose for it (full, sliding,
    chunked, recurrent, a kind this file has never heard of), with `safe_attention_mask` applied.

    The backbone builds each mask once and hands the same object to many layers, so the safe version is cached by
    identity for the duration of one forward (one copy, not one per layer, is kept for backward).
    """

    def __init__(self):
        self.cache = []  # [(mask the backbone built, safe mask)], emptied by the Stable forward
        self.past_length = 0  # tokens already in the KV cache, set by the Stable forward

    def __call__(self, layer, args, kwargs):
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = self.safe(kwargs["attention_mask"])
            return args, kwargs
        index = mask_position(type(layer))  # older layers (GPT-2) take the mask positionally
        if index is not None and index < len(args):
            args = (*args[:index], self.safe(args[index]), *args[index + 1 :])
        return args, kwargs

    def safe(self, mask):
        if isinstance(mask, dict):  # one mask per kind, built per layer (Zaya: {"causal": 4-D, "conv": 2-D})
            return {kind: self.safe(value) for kind, value in mask.items()}
        if mask is None or torch.compiler.is_compiling():
            return safe_attention_mask(mask, self.past_length)
        for built, safe in self.cache:
            if built is mask:
                return safe
        safe = safe_attention_mask(mask, self.past_length)
        self.cache = [*self.cache[-7:], (mask, safe)]  # bounded: the backbone may also be called on its own
        return safe


def pool(hidden_states: torch.Tensor, padding_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """Pool (batch, seq, hidden) to (batch, hidden) in fp32 (or fp64) using only the attention mask, never token ids."""
    dtype = at_least_fp32(hidden_states.dtype)
    if padding_mask is None:
        if pooling == "last":
            return hidden_states[:, -1].to(dtype)
        return hidden_states.to(dtype).mean(1)
    if pooling == "last":
        positions = torch.arange(padding_mask.shape[1], device=padding_mask.device)
        last = (positions * padding_mask).amax(-1)
        return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last].to(dtype)
    weights = padding_mask.to(dtype).unsqueeze(-1)
    return (hidden_states.to(dtype) * weights).sum(1) / weights.sum(1).clamp(min=1.0)


@torch.compiler.disable  # data-dependent: under torch.compile it runs eagerly (a graph break), never frozen
def packed_examples(position_ids: torch.Tensor, padding_mask: torch.Tensor | None):
    """For a packed batch (position ids restart at 0 for each example inside a row; rows may end in padding):
    (example index of every token, -1 on padding; position ids in which each row's padding restarts at 0, so that
    it forms a block of its own). None when no row holds more than one example."""
    real = torch.ones_like(position_ids, dtype=torch.bool) if padding_mask is None else padding_mask
    starts = (position_ids == 0) & real
    first_real = real & (real.long().cumsum(-1) == 1)
    if not (starts & ~first_real).any():
        return None
    if padding_mask is not None and (padding_mask[:, 1:] & ~padding_mask[:, :-1]).any():
        raise ValueError(
            "packed batch: padding must come at the end of a row (attention_mask 1...1 0...0), as "
            "stable_models.PackedCollator builds it."
        )
    if not starts[:, 0].all():
        raise ValueError("packed batch: every row must start a new example (position_ids[:, 0] == 0).")
    example_ids = torch.where(real.flatten(), starts.flatten().cumsum(0) - 1, -1)
    pad_positions = (~real).long().cumsum(-1) - 1
    return example_ids, torch.where(real, position_ids, pad_positions)


@torch.compiler.disable  # a data-dependent check
def in_feature_order(pooled: torch.Tensor, example_index: torch.Tensor) -> torch.Tensor:
    """Pooled examples (row-major) put back in the order of the features: `example_index[k]` is example k's feature."""
    example_index = example_index.to(pooled.device)
    if not torch.equal(example_index.sort().values, torch.arange(len(pooled), device=pooled.device)):
        raise ValueError(f"packed_example_index must be a permutation of the {len(pooled)} packed examples.")
    return torch.empty_like(pooled).index_copy_(0, example_index, pooled)


@torch.compiler.disable  # its output size is the number of examples, known only from the data
def pool_packed(hidden_states: torch.Tensor, example_ids: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool each example of a packed batch (example ids -1 on padding): its last token, or the fp32 mean of its
    tokens; examples in row-major order."""
    dtype = at_least_fp32(hidden_states.dtype)
    real = example_ids >= 0
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])[real]
    example_ids = example_ids[real]
    count = int(example_ids[-1]) + 1
    if pooling == "last":
        is_last = torch.ones_like(example_ids, dtype=torch.bool)
        is_last[:-1] = example_ids[1:] != example_ids[:-1]
        return flat[is_last].to(dtype)
    sums = torch.zeros(count, flat.shape[-1], dtype=dtype, device=flat.device).index_add_(
        0, example_ids, flat.to(dtype)
    )
    sizes = torch.bincount(example_ids, minlength=count).to(dtype).unsqueeze(-1)
    return sums / sizes


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
    for name, value, fits in (
        ("class_weights", class_weights, "single_label_classification"),
        ("label_smoothing", smoothing or None, "single_label_classification"),
        ("pos_weight", pos_weight, "multi_label_classification"),
    ):
        if value is not None and problem_type != fits:
            raise ValueError(f"{name} applies to {fits} only; this batch is {problem_type}. Unset {name}.")
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
                if label_weight_total is None:  # only Trainer's label count: this micro-batch's weight, scaled up
                    local = int((labels != -100).sum())
                    if local != int(num_items_in_batch) and not getattr(model, "_warned_weighted_by_count", True):
                        model._warned_weighted_by_count = True
                        message = WEIGHTED_BY_COUNT.format(name=type(model).__name__)
                        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
                    mine = total_class_weight(labels, class_weights)
                    label_weight_total = mine * num_items_in_batch / local if local and mine else num_items_in_batch
                num_items_in_batch = label_weight_total
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


MODEL_CARD = """---
library_name: transformers
tags: [stable_models, text-classification]
---
# {name}

A `stable_models` sequence classifier (`{name}`, pooling `{pooling}`): pooling from `attention_mask`, padding-invariant
logits, no fully masked attention rows, fp32 head, logits and loss. See https://pypi.org/project/stable_models/.

Load it with remote code, which this folder carries (no `stable_models` install needed):

```python
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained("path/to/this/folder", trust_remote_code=True)
```

**Without `trust_remote_code=True` transformers silently loads the stock `{stock}`** (same weights, none of
the guarantees). Check with `type(model).__name__ == "{name}"`.
"""


# Serving engines read a classifier's pooling from sentence-transformers files, not from config.json: vLLM's
# get_pooling_config takes the seq pooling from the Pooling module's config.json (last-token without one) and its
# activation from whether a Normalize module is listed. Written for `pooling="mean"` checkpoints only.
SENTENCE_TRANSFORMERS_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]
POOLING_FLAGS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def name_the_stock_architecture(folder: str, stock_name: str) -> None:
    """config.json's `architectures` as the stock class would write it. vLLM and other engines refuse a Stable name
    (they pick their implementation by it); `auto_map` still leads transformers to the Stable class."""
    path = os.path.join(folder, "config.json")
    with open(path) as handle:
        config = json.load(handle)
    if config.get("architectures") != [stock_name]:
        config["architectures"] = [stock_name]
        with open(path, "w") as handle:
            handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_pooling_files(folder: str, pooling: str, hidden_size: int) -> None:
    """A mean-pooled checkpoint carries modules.json + 1_Pooling/config.json (mean) so vLLM pools as we do (its
    default is the last token); a last-pooled one needs none, and files written here earlier are removed."""
    modules = os.path.join(folder, "modules.json")
    if pooling == "mean":
        os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
        os.makedirs(os.path.join(folder, "2_Normalize"), exist_ok=True)
        flags = {f"pooling_mode_{flag}": flag == "mean_tokens" for flag in POOLING_FLAGS}
        with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as handle:
            json.dump({"word_embedding_dimension": hidden_size, **flags, "include_prompt": True}, handle, indent=2)
        with open(modules, "w") as handle:
            json.dump(SENTENCE_TRANSFORMERS_MODULES, handle, indent=2)
        return
    try:
        with open(modules) as handle:
            ours = json.load(handle) == SENTENCE_TRANSFORMERS_MODULES
    except (OSError, ValueError):
        ours = False
    if ours:  # a stale mean-pooling declaration in a folder this checkpoint now overwrites
        os.remove(modules)
        pooling_config = os.path.join(folder, "1_Pooling", "config.json")
        if os.path.isfile(pooling_config):
            os.remove(pooling_config)
        for path in (os.path.join(folder, "1_Pooling"), os.path.join(folder, "2_Normalize")):
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)


def tokenizer_pad_token_id(*sources) -> int | None:
    """The pad id of the first tokenizer found locally at one of these folders or cached hub ids (no download)."""
    from transformers import AutoTokenizer  # only when a checkpoint is saved without pad_token_id

    for source in sources:
        if not source:
            continue
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except Exception:  # no tokenizer there: try the next source
            continue
        if getattr(tokenizer, "pad_token_id", None) is not None:
            return tokenizer.pad_token_id
    return None


NO_PAD_TOKEN_ID = (
    "{name}.save_pretrained({folder!r}): config.json gets no pad_token_id and no tokenizer with a pad token was "
    "found next to the model or where it was loaded from. This model pools by attention_mask and does not need it, "
    "but serving engines (TEI, infinity) and the stock class refuse batches of more than one text without it. Call "
    "stable_models.setup_pad_token(tokenizer, model) (or set model.config.pad_token_id) before saving."
)


def _fail(path, problem, fix):
    raise ValueError(f"{path}: {problem}. {fix}")


def check_safetensors(path: str) -> None:
    """Read a safetensors header with the standard library and check the file holds every tensor it lists."""
    size = os.path.getsize(path)
    fix = "The file is truncated or corrupt: save the model again or copy the file again."
    with open(path, "rb") as handle:
        if size < 8:
            _fail(path, f"only {size} bytes, no safetensors header", fix)
        (header_size,) = struct.unpack("<Q", handle.read(8))
        if header_size > size - 8:
            _fail(path, f"header of {header_size} bytes does not fit in a {size}-byte file", fix)
        try:
            header = json.loads(handle.read(header_size))
        except ValueError:
            _fail(path, "the safetensors header is not valid JSON", fix)
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    if 8 + header_size + end > size:
        _fail(path, f"{size} bytes, but its tensors need {8 + header_size + end}", fix)


def check_checkpoint(folder: str, require_auto_map: bool = True, pooling: str | None = None) -> None:
    """Raise a ValueError naming the file and the fix if a saved folder cannot load as a Stable model.

    Checks config.json, the classifier_pooling value (unless `pooling` overrides it), every weights file and, with
    `require_auto_map`, the auto_map entry and the code files that trust_remote_code loading needs.
    """
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        _fail(folder, "no config.json", "Point from_pretrained at the folder save_pretrained wrote.")
    try:
        with open(config_path) as handle:
            config = json.load(handle)
    except ValueError as error:
        _fail(config_path, f"not valid JSON ({error})", "Restore the file, or save the model again.")
    value = pooling or config.get("classifier_pooling", DEFAULT_POOLING)
    if value not in POOLING_MODES:
        _fail(
            config_path,
            f"classifier_pooling={value!r} is not one of {POOLING_MODES}",
            "Set it to 'last' or 'mean' in config.json, or pass pooling='last' to from_pretrained.",
        )
    if require_auto_map:
        target = (config.get("auto_map") or {}).get("AutoModelForSequenceClassification")
        if not target:
            _fail(
                config_path,
                "no auto_map for AutoModelForSequenceClassification, so AutoModel with "
                "trust_remote_code=True would silently load the stock class",
                "Load it with the Stable class's from_pretrained and save_pretrained it again.",
            )
        code_file = os.path.join(folder, target.split("--")[-1].rsplit(".", 1)[0] + ".py")
        for needed in (code_file, os.path.join(folder, "modeling_stable.py")):
            if not os.path.isfile(needed):
                _fail(needed, "missing: auto_map needs this code file", "Save the model again with save_pretrained.")
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
    elif os.path.isfile(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    elif os.path.isfile(os.path.join(folder, "pytorch_model.bin")):
        files = []
    else:
        _fail(
            folder,
            "no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)",
            "Copy the weights next to config.json, or save the model again.",
        )
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            _fail(path, "missing: the weights index lists it", "Copy every shard next to the index, or save again.")
        check_safetensors(path)


def fsdp2_sharded_parameters(model) -> dict[tuple[int, str], torch.Tensor]:
    """(id(module), name) -> the parameter FSDP2 (`fully_shard`) stores for it. During forward FSDP2 swaps each of
    its parameters for an unsharded copy in the mixed-precision policy's param_dtype; the sharded parameter is what
    the optimizer updates, i.e. the master weight. Read through FSDP2's internals; empty when they change."""
    sharded = {}
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if callable(state) else None
        for fsdp_param in getattr(group, "fsdp_params", ()):
            info, param = getattr(fsdp_param, "_module_info", None), getattr(fsdp_param, "sharded_param", None)
            if info is not None and param is not None:
                sharded[(id(info.module), info.param_name)] = param
    return sharded


def initialize_gathered(model, module) -> None:
    """Initialise a new module of a ZeRO-3 model with its parameters gathered: transformers 4.57 initialises a
    missing `score` while it is partitioned, leaving zeros or uninitialised memory (transformers#43847). Only
    called with ZeRO-3 enabled, i.e. with deepspeed already imported by transformers (this file, copied as remote
    code, imports nothing beyond torch and transformers)."""
    deepspeed = sys.modules["deepspeed"]
    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
        if torch.distributed.get_rank() == 0:  # rank 0 writes; GatheredParameters scatters it to the others
            model._init_weights(module)


def deepspeed_mixed_precision() -> bool:
    """DeepSpeed in bf16/fp16 mode, set up through transformers (as Trainer does): its optimizer updates fp32 copies
    of the half-precision parameters, i.e. keeps fp32 master weights."""
    from transformers.integrations.deepspeed import deepspeed_config

    config = deepspeed_config() or {}
    return any(config.get(key, {}).get("enabled") in (True, "auto") for key in ("bf16", "fp16"))


def low_precision_trainables(model) -> list[tuple[str, torch.dtype]]:
    """Trainable parameters stored in bf16/fp16, i.e. trained without fp32 master weights (under FSDP2: judged by
    the shards, not by the policy's unsharded copies; under DeepSpeed's bf16/fp16 modes none, its optimizer keeps
    fp32 copies)."""
    half = (torch.bfloat16, torch.float16)
    if deepspeed_mixed_precision():
        return []
    sharded = fsdp2_sharded_parameters(model)
    found, seen = [], set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            stored = sharded.get((id(module), name), param)
            if id(stored) not in seen and stored.requires_grad and stored.dtype in half:
                seen.add(id(stored))
                found.append((f"{module_name}.{name}" if module_name else name, stored.dtype))
    return found


LOW_PRECISION_ADVICE = (
    "{count} trainable parameters (e.g. {example}) are stored in {dtype} without fp32 master weights: AdamW updates "
    "smaller than half a {dtype} step round away (measured: 3 steps at lr 1e-6 change 2 % of bf16 weights, 95 % of "
    "fp32 ones), so the loss can stay flat. Load with dtype=torch.float32 and train under bf16 autocast "
    "(TrainingArguments(bf16=True)), or train LoRA adapters (peft keeps them in fp32)."
)


# Measured: padding reaches the real tokens inside the backbone (its Mamba layers), so no mask can keep padding
# invariance; these types are refused, saying why (model_type -> reason).
PADDING_REACHES_REAL_TOKENS = {
    "zamba": "padding reaches real tokens through its Mamba layers (fp64, tiny config: NaN logits with left padding)",
    "zamba2": "padding reaches real tokens through its Mamba layers (fp64, tiny config: 3.9e-7 off either side)",
    "deepseek_v4": (
        "its compressed attention pools keys over fixed windows of compress_rate tokens counted from the start of the "
        "row, so left padding mixes pads into the real tokens' compressed keys (tiny config, fp32: 0.37 off with left "
        "padding, 4e-7 with right)"
    ),
}


# Measured: packed batches come out wrong below a transformers release, because its masks for the model type ignore
# the position ids that separate the examples: model_type -> (first release that works, why).
PACKING_NEEDS = {
    "llama4_text": (
        (5,),
        "transformers 4.57's chunked-attention mask spans the packed examples (tiny config: 2.99 off)",
    ),
}


def transformers_version() -> tuple[int, ...]:
    version = importlib.import_module("transformers").__version__
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


# Where no wrapper can keep padding invariance: model_type -> (config flag that switches the coupling on, why).
BATCH_COUPLED = {
    "doge": (
        "is_moe",
        "its mixture-of-experts router splits router logits across all tokens of the batch (transformers' own "
        "comment: 'this split mixes router logits across tokens'), so three identical unpadded rows in one batch "
        "already get different logits",
    ),
}


# Layer kinds that carry a state along the whole row (Mamba, gated-delta and lightning linear attention): position ids
# cannot stop it at an example boundary, so packed examples would leak into each other.
RECURRENT_LAYER_KINDS = ("linear_attention", "mamba", "mamba2", "recurrent", "conv")


def recurrent_layer_kinds(config) -> list[str]:
    """The recurrent kinds among the text model's layers (`layer_types`, or Jamba's `layers_block_type`)."""
    text = config.get_text_config()
    kinds = getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None) or []
    return sorted({kind for kind in kinds if kind in RECURRENT_LAYER_KINDS})


class HideFalsePipelineError(logging.Filter):
    """transformers' pipeline checks the model's class *name* against the stock classes and logs at error level
    "The model 'StableQwen2ForSequenceClassification' is not supported for text-classification" although it is.
    This filter drops exactly that record for Stable classes; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(f"The model '{STABLE_PREFIX}") and "is not supported for" in message)


def hide_false_pipeline_error() -> None:
    """Install the filter on transformers' pipeline logger once, when the first Stable model is built."""
    logger = logging.getLogger("transformers.pipelines.base")
    if not any(isinstance(f, HideFalsePipelineError) for f in logger.filters):
        logger.addFilter(HideFalsePipelineError())


def warn_if_batch_coupled(model) -> None:
    """Say loudly where padding invariance (contract point 2) cannot hold, instead of claiming it."""
    flag, why = BATCH_COUPLED.get(model.config.model_type, (None, None))
    if flag and getattr(model.config, flag, False):
        warnings.warn(
            f"{type(model).__name__} with {flag}=True: the outputs of one row depend on the other rows of the batch, "
            f"because {why}. Padding invariance is impossible here; for reproducible per-text logits run one text at "
            "a time without padding (batch size 1), or use a config without it.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# Model types whose class stable_models builds, but that its tests do not run yet (no tiny config of theirs builds and
# runs there): model_type -> what stopped it. The class works as built; the guarantees are not verified, and it says so.
NOT_YET_TESTED = {
    "gemma3n": "its vision tower is a timm model, and timm needs a torchvision built for the installed torch, which "
    "the CPU test machines cannot install (its text model, gemma3n_text, is tested)",
}


def warn_if_not_yet_tested(model) -> None:
    """A class built for a model type the tests do not cover yet says so once, at construction."""
    if why := NOT_YET_TESTED.get(model.config.model_type):
        warnings.warn(
            f"{type(model).__name__}: stable_models builds this class, but its tests do not cover "
            f"model_type={model.config.model_type!r} yet ({why}), so padding invariance and parity with the stock "
            "class are not verified for it. Check them on your data (stable_models doctor) before relying on them.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


class StableSequenceClassificationMixin:
    """Put before a stock `*ForSequenceClassification` class: same constructor, weights, attributes and outputs.

    `pooling` ("last" or "mean") is a constructor / `from_pretrained` argument and is saved in `config.json` as
    `classifier_pooling`. So are the loss options, saved under their own names: `class_weights` (one per label) and
    `label_smoothing` for single-label classification, `pos_weight` (one per label) for multi-label.
    """

    _keep_in_fp32_modules_strict = ["score"]
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch, and the loss honours it

    def __init__(
        self, config, *args, pooling=None, class_weights=None, label_smoothing=None, pos_weight=None, **kwargs
    ):
        pooling = pooling or getattr(config, "classifier_pooling", None) or DEFAULT_POOLING
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling={pooling!r} is not supported; use one of {POOLING_MODES}.")
        options = checked_loss_options(config, class_weights, label_smoothing, pos_weight)
        config.classifier_pooling = pooling
        for name, value in options.items():
            if value is not None or hasattr(config, name):
                setattr(config, name, value)
        super().__init__(config, *args, **kwargs)
        self._warned_weighted_by_count = False
        self.score.__class__ = Fp32Linear  # same parameters and state-dict keys; only forward and dtype change
        self.score.float()
        text_config = config.get_text_config()
        if text_config is not config:  # multimodal configs: the text part answers num_labels questions too
            text_config.num_labels = config.num_labels
            text_config.problem_type = config.problem_type
        self._mask_guard = LayerMaskGuard()
        layers = [m for m in self.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise TypeError(f"{type(self).__name__}: found no decoder layers to guard the attention masks of.")
        for layer in layers:
            layer.register_forward_pre_hook(self._mask_guard, with_kwargs=True)
        warn_if_batch_coupled(self)
        warn_if_not_yet_tested(self)
        hide_false_pipeline_error()

    @classmethod
    def stock_class(cls) -> type:
        """The transformers class this Stable class extends: the first class in the MRO that is not a Stable one."""
        return next(
            c
            for c in cls.__mro__
            if c.__name__.endswith("ForSequenceClassification") and not issubclass(c, StableSequenceClassificationMixin)
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The stock loader, after checking a local folder so that a broken one fails with a clear message."""
        if (
            isinstance(pretrained_model_name_or_path, (str, os.PathLike))
            and os.path.isdir(pretrained_model_name_or_path)
            and not kwargs.get("gguf_file")  # the weights and config are in that file
        ):
            subfolder = kwargs.get("subfolder") or ""
            check_checkpoint(
                os.path.join(pretrained_model_name_or_path, subfolder),
                require_auto_map=False,
                pooling=kwargs.get("pooling"),
            )
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if not is_deepspeed_zero3_enabled():
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        wants_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        if any(key.split(".")[-2:-1] == ["score"] for key in info["missing_keys"]):
            initialize_gathered(model, model.score)
        return (model, info) if wants_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """The stock save (which also writes auto_map and copies this code), with the stock class's name in
        `architectures` (serving engines pick their implementation by it; transformers with trust_remote_code follows
        auto_map to the Stable class), the pad_token_id serving engines need (from a tokenizer next to the model or
        where it came from), the pooling files vLLM reads for a mean pooled checkpoint, and a model card."""
        main_process = kwargs.get("is_main_process", True)
        configs = {id(c): c for c in (self.config, self.config.get_text_config())}.values()
        pads = [getattr(c, "pad_token_id", None) for c in configs]  # a multimodal top level may have none at all
        if main_process and None in pads:
            pad = next((p for p in pads if p is not None), None)
            pad = pad if pad is not None else tokenizer_pad_token_id(save_directory, self.config._name_or_path)
            if pad is None and not getattr(self, "_warned_no_pad_token_id", False):
                self._warned_no_pad_token_id = True  # once, not at every Trainer checkpoint
                warnings.warn(
                    NO_PAD_TOKEN_ID.format(name=type(self).__name__, folder=str(save_directory)),
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            for config in configs:
                if pad is not None and getattr(config, "pad_token_id", None) is None:
                    config.pad_token_id = pad
        if main_process and type(self)._auto_class is not None:  # is_remote_code() answers False, as for the stock
            os.makedirs(save_directory, exist_ok=True)  # class, so the stock save no longer copies the code itself
            custom_object_save(self, save_directory, config=self.config)
        super().save_pretrained(save_directory, *args, **kwargs)
        if not main_process:
            return
        self.config.architectures = [self.stock_class().__name__]
        name_the_stock_architecture(str(save_directory), self.config.architectures[0])
        write_pooling_files(
            str(save_directory), self.config.classifier_pooling, self.config.get_text_config().hidden_size
        )
        card = os.path.join(save_directory, "README.md")
        if not os.path.exists(card):
            stock = self.stock_class()
            with open(card, "w") as handle:
                handle.write(
                    MODEL_CARD.format(
                        name=type(self).__name__, stock=stock.__name__, pooling=self.config.classifier_pooling
                    )
                )

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        num_items_in_batch=None,
        **kwargs: Unpack[TransformersKwargs],  # as the stock forward: tools read output_attentions & co. from it
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        # under torch.compile, torch.export or a tracing exporter (torch.onnx.export(dynamo=False), optimum) the
        # data-dependent checks and shortcuts would break the graph or be frozen into it as constants: skip them
        tracing = torch.jit.is_tracing()
        compiling = torch.compiler.is_compiling() or tracing
        if (tracing or getattr(torch.compiler, "is_exporting", bool)()) and (
            position_ids is not None or "packed_example_index" in kwargs
        ):
            raise ValueError(
                f"{type(self).__name__}: export or trace with input_ids and attention_mask only. An exported graph "
                "cannot tell a packed batch (position_ids restarting per example) from a padded one, so it would pool "
                "one example per row; the Stable forward derives the positions of a padded batch from the mask."
            )
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past_length = 0 if cache is None else cache.get_seq_length()
        if not compiling:
            check_inputs(self, input_ids, attention_mask, inputs_embeds, labels, past_length)
            if attention_mask is None and input_ids is not None:
                warn_if_padded_without_mask(self, input_ids)
            if self.training and torch.is_grad_enabled() and not getattr(self, "_low_precision_checked", False):
                self._low_precision_checked = True  # once, at the first training step
                if found := low_precision_trainables(self):
                    (example, dtype) = found[0]
                    advice = LOW_PRECISION_ADVICE.format(count=len(found), example=example, dtype=dtype)
                    warnings.warn(advice, UserWarning, stacklevel=user_stacklevel())
        tokens = input_ids if input_ids is not None else inputs_embeds
        query_length = tokens.shape[1]

        # padding-free packing (stable_models.PackedCollator): position ids restart at each example, rows may end in
        # padding; the backbone gets no mask, so transformers builds block-diagonal masks from the position ids (the
        # padding at the end of a row is a block of its own), and pooling works per example
        example_ids = None
        example_index = kwargs.pop("packed_example_index", None)
        label_weight_total = kwargs.pop("label_weight_total", None)  # StableTrainer: class weights of the whole batch
        padding_mask = None if attention_mask is None else attention_mask != 0
        if position_ids is not None and cache is None:  # under torch.compile: a graph break, exact results
            packed = packed_examples(position_ids, padding_mask)
            if packed is not None:
                if kinds := recurrent_layer_kinds(self.config):
                    raise ValueError(
                        f"{type(self).__name__} has {'/'.join(kinds)} layers, whose state runs along the whole row: in "
                        "a packed batch each example would see the ones before it. Pad instead of packing (a plain "
                        "DataCollatorWithPadding); padding keeps every guarantee for this model."
                    )
                if (need := PACKING_NEEDS.get(self.config.model_type)) and transformers_version() < need[0]:
                    raise ValueError(
                        f"{type(self).__name__}: packed batches need transformers >= {'.'.join(map(str, need[0]))} "
                        "for this model type "
                        f"({need[1]}). Upgrade transformers, or pad instead of packing (DataCollatorWithPadding)."
                    )
                example_ids, position_ids = packed
                attention_mask = padding_mask = None
        if padding_mask is not None and cache is None and not compiling and padding_mask.all():
            padding_mask = None  # nothing is padded: the plain causal path is exact and fastest
        backbone_mask = attention_mask  # the backbone builds the masks each layer needs; the guard fixes them
        if padding_mask is not None:
            left_padded = compiling or cache is not None or not padding_mask[:, 0].all()
            if position_ids is None and left_padded:  # right padding alone leaves the default 0, 1, 2, ... right
                position_ids = position_ids_from_mask(padding_mask, query_length)

        if not compiling:
            warn_if_longer_than_positions(self, query_length + past_length, position_ids, padding_mask)

        self._mask_guard.cache.clear()
        self._mask_guard.past_length = past_length
        try:
            outputs = getattr(self, self.base_model_prefix)(
                input_ids=input_ids,
                attention_mask=backbone_mask,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                use_cache=bool(use_cache),
                **kwargs,
            )
        finally:
            self._mask_guard.cache.clear()
            self._mask_guard.past_length = 0
        query_mask = None if padding_mask is None else padding_mask[:, -query_length:]
        if example_ids is not None:
            pooled = pool_packed(outputs.last_hidden_state, example_ids, self.config.classifier_pooling)
        else:
            pooled = pool(outputs.last_hidden_state, query_mask, self.config.classifier_pooling)
        if example_index is not None:  # back to the order of the features (rows of one example each: the same)
            pooled = in_feature_order(pooled, example_index)
        if outputs.last_hidden_state.dtype == torch.float16 and not compiling:
            if not torch.isfinite(pooled).all():
                raise ValueError(
                    f"{type(self).__name__} overflowed in float16: an activation exceeded 65504 (Gemma, Qwen and other "
                    "recent models have activations above it). Load the model with dtype=torch.bfloat16 (same range "
                    "as fp32) or torch.float32; train with bf16=True instead of fp16=True."
                )
        logits = self.score(pooled)

        loss = None
        if labels is not None:
            loss = sequence_classification_loss(
                logits, labels, self.config, num_items_in_batch, label_weight_total, model=self
            )
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{name: value for name, value in outputs.items() if name in ("cache", "past_key_values")},
        )


# Class questions transformers answers from the defining module's source or from `_auto_class` (set by
# register_for_auto_class so that save_pretrained copies this code). Asked of a Stable class they would describe this
# file: experts / attention kernels judged from its text (grouped_mm refused for MoE), and the custom-code loading path
# (missing weights left uninitialised, checkpoint conversions skipped). The stock class answers them instead; the ones
# this transformers release does not ask are not defined.
STOCK_CLASS_QUESTIONS = (
    "_can_set_attn_implementation",
    "_can_set_experts_implementation",
    "is_custom_code",
    "is_remote_code",
)


def ask_the_stock_class(question: str) -> classmethod:
    return classmethod(lambda cls: getattr(cls.stock_class(), question)())


for _question in STOCK_CLASS_QUESTIONS:
    if hasattr(PreTrainedModel, _question):
        setattr(StableSequenceClassificationMixin, _question, ask_the_stock_class(_question))

STABLE_PREFIX = "Stable"
_STABLE_CLASSES = {}  # stock class -> Stable class, built once


_BUILT_CLASSIFIERS = {}  # model_type -> the classifier transformers would write for a causal LM that has none


def decoder_classifier(model_type: str) -> type:
    """The decoder classifier of a model type: transformers' own (built on GenericForSequenceClassification, or an
    older one that also pools the last non-pad token: GPT-2, Pythia, OPT, BLOOM, ...), or, for a causal LM that has
    none, the class transformers would write for it (`built_classifier`). A ValueError names why a type cannot be
    classified with the contract."""
    transformers = importlib.import_module("transformers")
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    name = auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(model_type)
    stock = getattr(transformers, name, None) if isinstance(name, str) else None
    if stock is not None and issubclass(stock, GenericForSequenceClassification):
        return stock
    causal_name = auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    causal = getattr(transformers, causal_name, None) if isinstance(causal_name, str) else None
    if stock is None and causal is None:
        raise ValueError(
            f"model_type={model_type!r} cannot be classified: transformers {transformers.__version__} has neither a "
            "sequence classifier nor a causal LM for it."
        )
    refusal = why_not_a_decoder(model_type, stock or causal, stock)
    if refusal:
        raise ValueError(f"model_type={model_type!r} cannot be classified with stable_models' guarantees: {refusal}.")
    return stock or built_classifier(model_type, causal)


def why_not_a_decoder(model_type: str, model_class: type, stock: type | None) -> str | None:
    """Why a model type is no decoder-only text model whose decoder layers the mask guard reaches (None: it is one).
    `model_class` is its stock classifier or, where it has none, its causal LM."""
    transformers = importlib.import_module("transformers")
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    generation = importlib.import_module("transformers.generation")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    module = sys.modules[model_class.__module__]
    if any(is_encoder_decoder(c) for c in (model_class.config_class, configs.CONFIG_MAPPING[model_type])):
        return "it is the decoder of an encoder-decoder model (it reads an encoder's output)"
    if stock is None and "is_decoder" in inspect.getsource(model_class.__init__):
        return "it is a bidirectional encoder that only its causal LM turns into a decoder (is_decoder=True)"
    backbone_name = auto.MODEL_MAPPING_NAMES.get(model_type)
    backbone = getattr(transformers, backbone_name, None) if isinstance(backbone_name, str) else None
    if backbone is None:
        return "transformers has no base model (AutoModel) for it to put a classifier on"
    type_config = configs.CONFIG_MAPPING[model_type]
    if backbone.config_class in (getattr(type_config, "sub_configs", None) or {}).values():
        return (
            f"its base model ({backbone.__name__}) is one part of a larger model (it reads the "
            f"{backbone.config_class.__name__} inside {type_config.__name__})"
        )
    if backbone.main_input_name != "input_ids":
        return f"it is not a text model (its base model reads {backbone.main_input_name})"
    if issubclass(backbone, generation.GenerationMixin):
        return (
            f"its base model ({backbone.__name__}) is a generation model whose output has no last_hidden_state; "
            "classify with its text model's type instead"
        )
    if stock is None and not hasattr(default_text_config(type_config), "hidden_size"):
        return (
            f"its config ({type_config.__name__}) names no hidden_size, the width GenericForSequenceClassification "
            "sizes `score` by (the widths live in sub-configs)"
        )
    returns = inspect.signature(backbone.forward).return_annotation
    outputs = [a for a in typing.get_args(returns) or (returns,) if isinstance(a, type) and issubclass(a, ModelOutput)]
    missing = outputs and sorted(generic_reads() - set(outputs[0].__dataclass_fields__))
    if stock is None and missing:
        return (
            f"its base model returns {outputs[0].__name__}, without the {', '.join(missing)} that "
            "GenericForSequenceClassification reads (a recurrent model without attention)"
        )
    if "attention_mask" not in inspect.signature(backbone.forward).parameters:
        return "its base model takes no attention_mask, so padding would run into its state"
    if not any(
        isinstance(value, type)
        and issubclass(value, GradientCheckpointingLayer)
        and value.__module__ == module.__name__
        for value in vars(module).values()
    ):
        return "its layers are not GradientCheckpointingLayers, so the mask guard cannot reach their attention masks"
    if model_type in PADDING_REACHES_REAL_TOKENS:
        return PADDING_REACHES_REAL_TOKENS[model_type]
    if stock is not None:
        if not stock.base_model_prefix:  # the Stable forward calls the backbone by that name
            return f"its classifier ({stock.__name__}) names no base_model_prefix for its backbone"
        if "pad_token_id" not in inspect.getsource(stock.forward):  # decoder classifiers find the last non-pad token
            return "its classifier is an encoder's (bidirectional attention, pooling a first or summary token)"
        if "self.score" not in inspect.getsource(stock.__init__):
            return f"its classifier head is not one linear `score` layer on the pooled token ({stock.__name__})"
    return None


@functools.cache
def generic_reads() -> set[str]:
    """The fields of the base model's output that GenericForSequenceClassification.forward reads."""
    return set(re.findall(r"transformer_outputs\.(\w+)", inspect.getsource(GenericForSequenceClassification.forward)))


def built_classifier(model_type: str, causal: type) -> type:
    """`<Name>ForSequenceClassification(GenericForSequenceClassification, <Name>PreTrainedModel)`, exactly as
    transformers writes its own (Llama, Qwen3, ...): `<Name>` from the config class, the backbone from AutoModel.
    It is defined in the model's modeling module, so transformers answers class questions as for its own classes."""
    if model_type not in _BUILT_CLASSIFIERS:
        pretrained = next(c for c in causal.__mro__ if c.__name__.endswith("PreTrainedModel"))
        config_class = importlib.import_module("transformers.models.auto.configuration_auto").CONFIG_MAPPING[model_type]
        name = config_class.__name__.removesuffix("Config") + "ForSequenceClassification"
        # the model's own backbone attribute where it names one (GPT-style models: `transformer`), so the causal LM's
        # checkpoint loads; else Generic's `model`, as in transformers' own Generic classes
        prefix = pretrained.base_model_prefix or GenericForSequenceClassification.base_model_prefix
        attributes = {"__module__": pretrained.__module__, "base_model_prefix": prefix}
        cls = type(name, (GenericForSequenceClassification, pretrained), attributes)
        cls.__qualname__ = name
        cls.config_class = config_class
        _BUILT_CLASSIFIERS[model_type] = cls
    return _BUILT_CLASSIFIERS[model_type]


def default_text_config(config_class):
    """The text part of the config class's defaults (the class itself where it needs arguments)."""
    try:
        return config_class().get_text_config()
    except Exception:  # a config that needs arguments: judge it by its class attributes
        return config_class


def is_encoder_decoder(config_class) -> bool:
    """The config's default `is_encoder_decoder` (a class attribute in transformers 5; an instance's in 4.57)."""
    flag = getattr(config_class, "is_encoder_decoder", None)
    if flag is None:
        try:
            flag = config_class().is_encoder_decoder
        except Exception:  # a config that needs arguments: not one of the seq2seq configs, which have defaults
            flag = False
    return bool(flag)


def stable_class(stock_class):
    """The Stable class for a decoder classifier (from `decoder_classifier`): the mixin put before it, nothing else.

    The class lives in this module (`__module__`), so `save_pretrained` copies this one file and writes
    `auto_map = modeling_stable.Stable<Name>`, which `__getattr__` below rebuilds wherever the folder is loaded.
    """
    if not (isinstance(stock_class, type) and stock_class.__name__.endswith("ForSequenceClassification")):
        raise TypeError(f"{stock_class!r} is not a *ForSequenceClassification class; see decoder_classifier().")
    if stock_class not in _STABLE_CLASSES:
        name = STABLE_PREFIX + stock_class.__name__
        cls = type(
            name,
            (StableSequenceClassificationMixin, stock_class),
            {
                "__module__": __name__,
                "__doc__": (
                    f"`{stock_class.__name__}` with the stable_models contract (see StableSequenceClassificationMixin)."
                ),
            },
        )
        cls.__qualname__ = name
        cls.register_for_auto_class("AutoModelForSequenceClassification")
        _STABLE_CLASSES[stock_class] = cls
    return _STABLE_CLASSES[stock_class]


def model_type_of(classifier_name: str) -> str | None:
    """The model type whose classifier is (or would be) called `classifier_name`: transformers' own classifiers by
    name, built ones by their config class (`Gemma4TextForSequenceClassification` -> `Gemma4TextConfig`)."""
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    for model_type, name in auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.items():
        if name == classifier_name:
            return model_type
    config_name = classifier_name.removesuffix("ForSequenceClassification") + "Config"
    for model_type, name in configs.CONFIG_MAPPING_NAMES.items():
        if name == config_name and model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return model_type
    return None


def __getattr__(name: str):
    """`Stable<Name>ForSequenceClassification` for every decoder classifier `decoder_classifier` gives, built on
    first use (remote-code loading, pickling and `from stable_models import ...` all come through here)."""
    if name.startswith(STABLE_PREFIX) and name.endswith("ForSequenceClassification"):
        model_type = model_type_of(name[len(STABLE_PREFIX) :])
        if model_type is not None:
            try:
                return stable_class(decoder_classifier(model_type))
            except ValueError:
                pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
