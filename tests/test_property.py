"""Property-based padding invariance: random lengths, padding sides, pad == eos, pad ids inside the text."""

from functools import cache

import torch
from architectures import BY_NAME, EOS, FIRST_CLASS, PAD, VOCAB, make_models, pad_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@cache
def model_for(arch: str, pad_id: int, pooling: str):
    """Built when a drawn case first needs it (not at collection: every pytest run would pay for all of them)."""
    return make_models(BY_NAME[arch], pad_token_id=pad_id, pooling=pooling)[0]


@st.composite
def batches(draw):
    arch = draw(st.sampled_from([a.name for a in FIRST_CLASS]))
    pad_id = draw(st.sampled_from([PAD, EOS]))  # EOS: pad == eos, as with Llama/Qwen tokenizers
    token = st.integers(0, VOCAB - 1)  # includes the pad id, so pad ids appear inside texts
    sequences = draw(st.lists(st.lists(token, min_size=1, max_size=12), min_size=1, max_size=4))
    if draw(st.booleans()):
        sequences = [s + [EOS] for s in sequences]  # texts that end with eos
    return arch, pad_id, draw(st.sampled_from(["last", "mean"])), draw(st.sampled_from(["left", "right"])), sequences


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_batched_logits_equal_each_sequence_alone(case):
    arch, pad_id, pooling, side, sequences = case
    model = model_for(arch, pad_id, pooling)
    sequences = [torch.tensor(s) for s in sequences]
    ids, mask = pad_batch(sequences, side, pad_id=pad_id)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        alone = torch.cat([model(s[None]).logits for s in sequences])
    assert (batched - alone).abs().max() <= 1e-5
