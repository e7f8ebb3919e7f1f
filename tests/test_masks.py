"""Contract point 3: no attention kernel ever receives a fully masked row, and real tokens never see padding.

A probe attention implementation, registered through transformers' AttentionInterface (with the sdpa mask
format), records every mask the layers receive. A second probe behaves like the fused CUDA SDPA kernels that
return NaN for a fully masked row (pytorch#110213), which reproduces the Gemma2 + padding NaN on CPU.
"""

import sys

import pytest
import torch
from architectures import FIRST_CLASS, attention_layer_count, make_models, pad_batch, random_sequences
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

RECORDED = []


def visible(attention_mask):
    """The boolean view of a mask: True where a query may attend (Doge hands kernels an additive float mask; MPT
    hands its layers bool masks with True = masked, told apart as the core does: the first query never sees the last
    key of a causal mask)."""
    if attention_mask is None:
        return attention_mask
    if attention_mask.dtype == torch.bool:
        if attention_mask.shape[-2] == 1:
            return attention_mask
        return torch.where(attention_mask[..., :1, -1:], ~attention_mask, attention_mask)
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def _eager_with_bool_mask(module, query, key, value, attention_mask, **kwargs):
    eager = sys.modules[type(module).__module__].eager_attention_forward
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        additive = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = additive.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, **kwargs)


def recording_attention(module, query, key, value, attention_mask, **kwargs):
    RECORDED.append(visible(attention_mask))
    return _eager_with_bool_mask(module, query, key, value, attention_mask, **kwargs)


def nan_on_empty_rows_attention(module, query, key, value, attention_mask, **kwargs):
    """Eager attention, except that a query row with no visible key yields NaN, as fused GPU kernels do."""
    output, weights = _eager_with_bool_mask(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None:
        empty = ~visible(attention_mask).any(-1)  # (batch, heads or 1, q)
        output = output.masked_fill(empty.any(1)[:, :, None, None], float("nan"))
    return output, weights


@pytest.fixture(scope="module", autouse=True)
def probes():
    names = {"recording_probe": recording_attention, "nan_probe": nan_on_empty_rows_attention}
    for name, function in names.items():
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sdpa_mask)
    yield
    for name in names:
        del AttentionInterface._global_mapping[name]
        del AttentionMaskInterface._global_mapping[name]


def recorded_masks(model, ids, mask):
    RECORDED.clear()
    model.set_attn_implementation("recording_probe")
    with torch.no_grad():
        model(ids, attention_mask=mask)
    return list(RECORDED)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_every_row_sees_a_key_and_real_tokens_never_see_padding(arch, side):
    stable, stock = make_models(arch)
    ids, mask = pad_batch(random_sequences([9, 4, 6]), side)
    masks = recorded_masks(stable, ids, mask)
    assert len(masks) == attention_layer_count(stable.config)
    padding = mask.bool()
    for layer_mask in masks:
        assert layer_mask.shape == (3, 1, 9, 9)
        assert layer_mask.any(-1).all(), "a query row with no visible key reached the attention kernel"
        real_queries_see = layer_mask[:, 0] & padding[:, :, None]
        assert not (real_queries_see & ~padding[:, None, :]).any(), "a real token attends to padding"
    if arch.mixes_layer_types:  # full and sliding-window layers both ran, and differ
        assert not torch.equal(masks[0], masks[1])
    stock_masks = recorded_masks(stock, ids, mask)
    if side == "left" or arch.has_sliding_window:
        assert any((~m.any(-1)).any() for m in stock_masks), "the stock class was expected to send empty rows"


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_kernel_that_returns_nan_for_empty_rows(arch, side):
    """transformers#32390: padding + a NaN-on-empty-row kernel makes the stock loss NaN."""
    stable, stock = make_models(arch, num_hidden_layers=3)  # a sliding-window layer that is not the last
    ids, mask = pad_batch(random_sequences([9, 4, 6]), side)
    labels = torch.tensor([0, 1, 2])
    for model in (stable, stock):
        model.set_attn_implementation("nan_probe")
        model.train()
    out = stable(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in stable.parameters() if p.grad is not None)
    # left padding: the leading pads see nothing; right padding: a trailing pad whose sliding window holds only
    # pads sees nothing. 0 x NaN then spreads the NaN from padding rows into every real token.
    if side == "left" or arch.has_sliding_window:
        assert torch.isnan(stock(ids, attention_mask=mask, labels=labels).loss)
    else:
        assert torch.isfinite(stock(ids, attention_mask=mask, labels=labels).loss)


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_user_registered_attention_gives_the_eager_logits(arch):
    stable, _ = make_models(arch)
    ids, mask = pad_batch(random_sequences([9, 4, 6]), "left")
    with torch.no_grad():
        eager = stable(ids, attention_mask=mask).logits
        stable.set_attn_implementation("recording_probe")
        probe = stable(ids, attention_mask=mask).logits
    assert (eager - probe).abs().max() <= 1e-5
