"""Self-contained core of stable_models: mask-driven pooling, an fp32 head and loss, safe attention masks.

This file is copied next to a saved checkpoint (remote code), so it imports only torch and transformers.
Every architecture file combines `StableSequenceClassificationMixin` with the stock
`*ForSequenceClassification` class; the mixin replaces `forward` and nothing else.
"""

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    create_causal_mask,
    create_sliding_window_causal_mask,
    flash_attention_mask,
)
from transformers.modeling_outputs import SequenceClassifierOutputWithPast
from transformers.utils.generic import can_return_tuple

POOLING_MODES = ("last", "mean")
DEFAULT_POOLING = "last"
MASK_BUILDERS = {
    "full_attention": create_causal_mask,
    "sliding_attention": create_sliding_window_causal_mask,
}


class Fp32Linear(nn.Linear):
    """Classifier head that computes in fp32 and keeps fp32 weights through `.to(bf16)`, `.half()` and autocast.

    A bf16 head rounds logits to 8 significant bits: a margin-20 logit pair then gives a loss of exactly 0.0.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(hidden.float(), self.weight.float(), bias)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for param in self.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.float()
        return self


def _rows(flags: torch.Tensor) -> list[int]:
    return flags.nonzero().flatten().tolist()[:10]


def check_inputs(model, input_ids, attention_mask, inputs_embeds, labels) -> None:
    """Turn inputs that would silently give NaN, garbage or a device-side assert into a clear ValueError."""
    tokens = input_ids if input_ids is not None else inputs_embeds
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[0] != tokens.shape[0] or attention_mask.shape[1] < tokens.shape[1]:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the inputs have shape "
                f"{tuple(tokens.shape[:2])}: pass a 2D mask (batch, sequence) built by the same tokenizer call as the "
                "input_ids (tokenizer(..., padding=True, return_tensors='pt'))."
            )
        empty = ~(attention_mask[:, -tokens.shape[1]:] != 0).any(-1)
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
    if labels is not None and not labels.is_floating_point() and model.config.num_labels > 1:
        bad = ((labels < 0) | (labels >= model.config.num_labels)) & (labels != -100)
        if bad.any():
            raise ValueError(
                f"labels {sorted(set(labels[bad].tolist()))[:10]} are outside 0..{model.config.num_labels - 1} "
                f"(num_labels={model.config.num_labels}). Load the model with num_labels set to the number of classes, "
                "or map the labels to 0..num_labels-1 (-100 marks a row to ignore)."
            )


def position_ids_from_mask(padding_mask: torch.Tensor, query_length: int) -> torch.Tensor:
    """Real tokens get positions 0, 1, 2, ... whatever padding precedes them, so left padding changes nothing."""
    positions = padding_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)[:, -query_length:]


def keep_real_keys_and_self(padding_mask: torch.Tensor):
    """Mask function: a query sees the real keys (causal and window rules still apply) and always itself.

    A padding query would otherwise see nothing: a fully masked row, which fused SDPA kernels turn into NaN.
    Real queries never see padding keys, since a padding key is never the query's own position.
    """

    def mask_function(batch_idx, head_idx, q_idx, kv_idx):
        return padding_mask[batch_idx, kv_idx] | (q_idx == kv_idx)

    return mask_function


def build_attention_masks(config, padding_mask, inputs_embeds, cache, layer_types):
    """One mask per layer type, none of them with an empty row.

    Flash kernels drop padding rows themselves (varlen) and take the 2D mask; attention implementations without a
    mask builder get what the stock model would give them.
    """
    implementation = config._attn_implementation
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS or ALL_MASK_ATTENTION_FUNCTIONS[implementation] is flash_attention_mask:
        return padding_mask
    mask_function = keep_real_keys_and_self(padding_mask)
    return {
        layer_type: MASK_BUILDERS[layer_type](**_mask_builder_kwargs(layer_type, config, inputs_embeds, cache, mask_function))
        for layer_type in layer_types
    }


def _mask_builder_kwargs(layer_type, config, inputs_embeds, cache, and_mask_function):
    """Keyword arguments for transformers' mask builders, whose names changed between 4.57 and 5.x.

    `attention_mask=None` on purpose: the builder would AND the padding mask over our function and empty the rows of
    padding queries again; `keep_real_keys_and_self` already applies the padding.
    """
    params = inspect.signature(MASK_BUILDERS[layer_type]).parameters
    kwargs = {"config": config, "attention_mask": None, "and_mask_function": and_mask_function}
    kwargs["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = inputs_embeds
    kwargs["cache" if "cache" in params else "past_key_values"] = cache
    if "cache_position" in params:
        past_length = cache.get_seq_length() if cache is not None else 0
        kwargs["cache_position"] = torch.arange(past_length, past_length + inputs_embeds.shape[1], device=inputs_embeds.device)
    return kwargs


def pool(hidden_states: torch.Tensor, padding_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """Pool (batch, seq, hidden) to (batch, hidden) in fp32 using only the attention mask, never token ids."""
    if padding_mask is None:
        if pooling == "last":
            return hidden_states[:, -1].float()
        return hidden_states.float().mean(1)
    if pooling == "last":
        positions = torch.arange(padding_mask.shape[1], device=padding_mask.device)
        last = (positions * padding_mask).amax(-1)
        return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last].float()
    weights = padding_mask.to(torch.float32).unsqueeze(-1)
    return (hidden_states.float() * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def sequence_classification_loss(logits, labels, config, num_items_in_batch=None):
    """fp32 loss for regression, single- and multi-label classification, as the stock class picks them.

    With `num_items_in_batch` (Trainer with gradient accumulation) the loss is a sum divided by the number of labels
    in the whole accumulated batch, so micro-batches add up to the loss of one big batch.
    """
    logits = logits.float()
    labels = labels.to(logits.device)
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    reduction = "mean" if num_items_in_batch is None else "sum"
    if config.problem_type == "regression":
        if config.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.squeeze(-1).float(), reduction=reduction)
        else:
            loss = F.mse_loss(logits, labels.float(), reduction=reduction)
    elif config.problem_type == "single_label_classification":
        loss = F.cross_entropy(logits.view(-1, config.num_labels), labels.view(-1), reduction=reduction)
    else:
        loss = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction=reduction)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


class StableSequenceClassificationMixin:
    """Put before a stock `*ForSequenceClassification` class: same constructor, weights, attributes and outputs.

    `pooling` ("last" or "mean") is a constructor / `from_pretrained` argument and is saved in `config.json` as
    `classifier_pooling`.
    """

    _keep_in_fp32_modules_strict = ["score"]
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch, and the loss honours it
    backbone_takes_mask_dict = True  # False for backbones that want one mask tensor, not one per layer type

    def __init__(self, config, *args, pooling: str | None = None, **kwargs):
        pooling = pooling or getattr(config, "classifier_pooling", None) or DEFAULT_POOLING
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling={pooling!r} is not supported; use one of {POOLING_MODES}.")
        config.classifier_pooling = pooling
        super().__init__(config, *args, **kwargs)
        self.score.__class__ = Fp32Linear  # same parameters and state-dict keys; only forward and dtype change
        self.score.float()

    def _layer_types(self) -> list[str]:
        """The attention kinds the backbone's layers use, i.e. which masks it needs."""
        if getattr(self.config, "layer_types", None):
            return sorted(set(self.config.layer_types))
        return ["sliding_attention" if getattr(self.config, "sliding_window", None) else "full_attention"]

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
        **kwargs,
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if not torch.compiler.is_compiling():
            check_inputs(self, input_ids, attention_mask, inputs_embeds, labels)
        tokens = input_ids if input_ids is not None else inputs_embeds
        query_length = tokens.shape[1]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))

        padding_mask = None if attention_mask is None else attention_mask != 0
        if padding_mask is not None and cache is None and not torch.compiler.is_compiling() and padding_mask.all():
            padding_mask = None  # nothing is padded: the plain causal path is exact and fastest
        backbone_mask = attention_mask
        if padding_mask is not None:
            if position_ids is None:
                position_ids = position_ids_from_mask(padding_mask, query_length)
            if inputs_embeds is None:
                inputs_embeds = self.get_input_embeddings()(input_ids)
                input_ids = None
            layer_types = self._layer_types()
            backbone_mask = build_attention_masks(self.config, padding_mask, inputs_embeds, cache, layer_types)
            if isinstance(backbone_mask, dict) and not self.backbone_takes_mask_dict:
                (backbone_mask,) = backbone_mask.values()

        outputs = getattr(self, self.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=backbone_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=bool(use_cache),
            **kwargs,
        )
        query_mask = None if padding_mask is None else padding_mask[:, -query_length:]
        pooled = pool(outputs.last_hidden_state, query_mask, self.config.classifier_pooling)
        logits = self.score(pooled)

        loss = None
        if labels is not None:
            loss = sequence_classification_loss(logits, labels, self.config, num_items_in_batch)
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{name: value for name, value in outputs.items() if name in ("cache", "past_key_values")},
        )
