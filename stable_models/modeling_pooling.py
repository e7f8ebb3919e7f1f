"""Pooling: one vector per text from the attention mask (never token ids), in fp32; per example in packed rows.

Part of the core that save_pretrained copies next to a checkpoint: imports only torch and flat `modeling_*` siblings.
"""

import torch

POOLING_MODES = ("last", "mean")


DEFAULT_POOLING = "last"


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


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


def without_leading(padding_mask: torch.Tensor, leading: torch.Tensor) -> torch.Tensor:
    """The padding mask without the first `leading[i]` real tokens of row i (a prompt left out of the mean, as
    sentence-transformers' `Pooling(include_prompt=False)` leaves it, on either padding side), never a row's last real
    token (a text that is all prompt keeps one token to pool)."""
    real = padding_mask.bool()
    rank = real.long().cumsum(-1)  # 1, 2, ... along each row's real tokens
    keep_from = torch.minimum(leading.to(rank.device).reshape(-1, 1), rank[:, -1:] - 1)
    return real & (rank > keep_from)


def packed_without_leading(example_ids: torch.Tensor, position_ids: torch.Tensor, leading: torch.Tensor):
    """`without_leading` for packed rows: the tokens of example k before position `leading[k]` (examples row-major)
    get example id -1, so pooling skips them; each example keeps its last token."""
    real = example_ids >= 0
    per_token = leading.to(example_ids.device)[example_ids.clamp(min=0)]
    is_last = torch.ones_like(real)
    is_last[:-1] = example_ids[1:] != example_ids[:-1]
    keep = real & ((position_ids.reshape(-1) >= per_token) | is_last)
    return torch.where(keep, example_ids, -1)


@torch.compiler.disable  # data-dependent: under torch.compile it runs eagerly (a graph break), never frozen
def packed_examples(position_ids: torch.Tensor, padding_mask: torch.Tensor | None):
    """For a packed batch (a new example starts wherever the position does not rise: at 0 for an example of its own,
    or back at the end of a prefix it shares with the example before, `stable_models.PackedGroupCollator`; rows may
    end in padding): (example index of every token, -1 on padding; position ids in which each row's padding restarts
    at 0, so that it forms a block of its own; whether some example continues a shared prefix). None when no row holds
    more than one example."""
    real = torch.ones_like(position_ids, dtype=torch.bool) if padding_mask is None else padding_mask
    previous = torch.cat([position_ids[:, :1], position_ids[:, :-1]], dim=1)
    starts = (position_ids <= previous) & real
    first_real = real & (real.long().cumsum(-1) == 1)
    starts = starts | first_real
    if not (starts & ~first_real).any():
        return None
    if padding_mask is not None and (padding_mask[:, 1:] & ~padding_mask[:, :-1]).any():
        raise ValueError(
            "packed batch: padding must come at the end of a row (attention_mask 1...1 0...0), as "
            "stable_models.PackedCollator builds it."
        )
    if not (position_ids[:, 0] == 0).all():
        raise ValueError("packed batch: every row must start a new example (position_ids[:, 0] == 0).")
    example_ids = torch.where(real.flatten(), starts.flatten().cumsum(0) - 1, -1)
    pad_positions = (~real).long().cumsum(-1) - 1
    shares_prefixes = bool((starts & (position_ids > 0)).any())
    return example_ids, torch.where(real, position_ids, pad_positions), shares_prefixes


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
