"""Finiteness matrix: architecture x dtype x padding x pooling x attention kernel, forward and backward."""

import pytest
import torch
from architectures import ARCH_ATTN, ARCH_ATTN_IDS, is_vision_part, make_models, pad_batch, random_sequences

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("padding", ["left", "right", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN, ids=ARCH_ATTN_IDS)
def test_forward_and_backward_stay_finite(arch, attn, dtype, padding, pooling):
    stable, _ = make_models(arch, attn, dtype=DTYPES[dtype], pooling=pooling)
    stable.train()
    lengths = [7, 7, 7] if padding == "none" else [9, 2, 5]  # up to 7 pads, sliding window 3
    ids, mask = pad_batch(random_sequences(lengths), "left" if padding == "none" else padding)
    out = stable(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    assert out.logits.dtype == out.loss.dtype == torch.float32
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    grads = [p.grad for name, p in stable.named_parameters() if p.requires_grad and not is_vision_part(name)]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
