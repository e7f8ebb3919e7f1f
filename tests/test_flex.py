"""flex attention on CPU (forward only: torch has no flex backward on CPU): the BlockMask the backbone builds gets
self-attention for padding queries, and packed rows stay block-diagonal."""

import pytest
import torch
from architectures import BY_NAME, logits_alone, make_models, pad_batch, random_sequences

from stable_models import PackedCollator

LENGTHS = [9, 4, 6, 1, 5]


@pytest.fixture(scope="module")
def flex_model():
    stable, _ = make_models(BY_NAME["qwen2"], "flex_attention")
    return stable


def token_mask(block_mask, length):
    """A BlockMask's mask function evaluated on every (batch, query, key): to_dense() only resolves 128-blocks."""
    batch = torch.arange(block_mask.shape[0])[:, None, None, None]
    positions = torch.arange(length)
    return block_mask.mask_mod(batch, torch.zeros(()), positions[None, None, :, None], positions[None, None, None, :])


def layer_block_masks(model, ids, mask):
    """The BlockMask each decoder layer receives (recorded after the Stable guard), as dense boolean masks."""
    seen = []
    handles = [
        layer.register_forward_pre_hook(
            lambda m, a, k: seen.append(token_mask(k["attention_mask"], ids.shape[1])), with_kwargs=True
        )
        for layer in model.model.layers
    ]
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    for handle in handles:
        handle.remove()
    return logits, seen


def test_flex_padding_invariance_and_no_empty_rows(flex_model):
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, "left")
    batched, masks = layer_block_masks(flex_model, ids, mask)
    assert (batched - logits_alone(flex_model, sequences)).abs().max() <= 1e-5
    assert masks and all(m.any(-1).all() for m in masks)
    _, stock = make_models(BY_NAME["qwen2"], "flex_attention")
    stock_masks = []
    handle = stock.model.layers[0].register_forward_pre_hook(
        lambda m, a, k: stock_masks.append(token_mask(k["attention_mask"], ids.shape[1])), with_kwargs=True
    )
    with torch.no_grad():
        stock(ids, attention_mask=mask)
    handle.remove()
    assert not stock_masks[0].any(-1).all()  # the stock class: empty rows


def test_flex_capped_packed_rows(flex_model):
    sequences = random_sequences(LENGTHS)
    batch = PackedCollator(max_tokens=12)([{"input_ids": s} for s in sequences])
    assert batch["input_ids"].shape[0] == 3
    with torch.no_grad():
        packed = flex_model(**batch).logits
    assert (packed - logits_alone(flex_model, sequences)).abs().max() <= 1e-5
