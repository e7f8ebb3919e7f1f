"""Attention-mask safety: no fully masked query row reaches an attention kernel, and left padding keeps positions.

Every decoder layer gets the mask its backbone built for it (full, sliding, chunked, flex BlockMask, a dict per kind),
with the diagonal opened for padding queries (`LayerMaskGuard`). Part of the core copied next to a checkpoint.
"""

import functools
import inspect

import torch


def position_ids_from_mask(padding_mask: torch.Tensor, query_length: int) -> torch.Tensor:
    """Real tokens get positions 0, 1, 2, ... whatever padding precedes them, so left padding changes nothing."""
    positions = padding_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)[:, -query_length:]


def shared_prefix_mask(position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4D float mask (0 = attend) of packed rows whose examples share prefixes: position ids 0..P-1 for the prefix,
    then P, P+1, ... again for every example that continues it (`stable_models.PackedGroupCollator`).

    Token j sees token i <= j when every position after i up to j is above position i's: an example sees its prefix
    and itself, never a sibling (the sibling's first position is not above the sibling's own tokens) nor the next
    group (which restarts at 0). Where every example starts at 0 this is the block-diagonal mask of plain packing.
    """
    length = position_ids.shape[-1]
    later = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).triu(1)  # [i, k]: k > i
    stops = (position_ids[:, None, :] <= position_ids[:, :, None]) & later  # [b, i, k]: k ends what i is seen by
    ends = torch.where(stops.any(-1), stops.int().argmax(-1), length)  # [b, i]: first such k
    keys = torch.arange(length, device=position_ids.device)
    seen = (keys[None, None, :] <= keys[None, :, None]) & (keys[None, :, None] < ends[:, None, :])  # [b, query, key]
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(~seen, torch.finfo(dtype).min)[:, None]


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
