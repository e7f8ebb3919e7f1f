"""Contract points 1-2: pooling reads attention_mask only, and padding never changes a sequence's logits."""

import pytest
import torch
from architectures import (
    ARCH_ATTN,
    ARCH_ATTN_IDS,
    EOS,
    FIRST_CLASS,
    PAD,
    logits_alone,
    make_models,
    pad_batch,
    random_sequences,
)

LENGTHS = [9, 4, 6]  # padding of up to 5 tokens, longer than the sliding window (3)
FP32_TOL = 1e-5


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN, ids=ARCH_ATTN_IDS)
def test_padded_batch_matches_each_sequence_alone_fp32(arch, attn, side, pooling):
    stable, _ = make_models(arch, attn, pooling=pooling)
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, side)
    with torch.no_grad():
        batched = stable(ids, attention_mask=mask).logits
    assert (batched - logits_alone(stable, sequences)).abs().max() <= FP32_TOL


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_mean_pooling_is_the_masked_mean_of_real_tokens(arch):
    stable, _ = make_models(arch, pooling="mean")
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, "left")
    with torch.no_grad():
        logits = stable(ids, attention_mask=mask).logits
        for row, seq in enumerate(sequences):
            hidden = stable.base_model(seq[None]).last_hidden_state[0]
            expected = stable.score(hidden.double().mean(0).float())
            assert (logits[row] - expected).abs().max() <= FP32_TOL


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_pad_equal_to_eos_pools_the_real_last_token(arch):
    """Qwen-style tokenizers end texts with eos; with pad == eos the stock class skips every trailing eos."""
    stable, stock = make_models(arch, pad_token_id=EOS)
    sequences = [torch.cat([s, torch.tensor([EOS])]) for s in random_sequences(LENGTHS)]
    ids, mask = pad_batch(sequences, "right", pad_id=EOS)
    with torch.no_grad():
        truth = torch.stack([stable.score(stable.base_model(s[None]).last_hidden_state[0, -1]) for s in sequences])
        assert (stable(ids, attention_mask=mask).logits - truth).abs().max() <= FP32_TOL
        assert (stock(ids, attention_mask=mask).logits - truth).abs().max() > 1e-2


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_pad_id_inside_the_text_is_still_text(arch):
    """A text whose last real token has the pad id (Qwen3-Embedding#122): the mask says it is content."""
    stable, stock = make_models(arch)
    sequences = random_sequences(LENGTHS)
    sequences[1] = torch.cat([sequences[1], torch.tensor([PAD, PAD])])
    sequences[2][2] = PAD
    ids, mask = pad_batch(sequences, "right")
    with torch.no_grad():
        expected = logits_alone(stable, sequences)
        assert (stable(ids, attention_mask=mask).logits - expected).abs().max() <= FP32_TOL
        assert (stock(ids, attention_mask=mask).logits[1] - expected[1]).abs().max() > 1e-2


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_inputs_embeds_with_padding(arch, side):
    """Without input_ids the stock class pools position -1, a pad under right padding (transformers#34218)."""
    stable, stock = make_models(arch)
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, side)
    with torch.no_grad():
        embeds = stable.get_input_embeddings()(ids)
        expected = logits_alone(stable, sequences)
        assert (stable(inputs_embeds=embeds, attention_mask=mask).logits - expected).abs().max() <= FP32_TOL
        if side == "right":
            assert (stock(inputs_embeds=embeds, attention_mask=mask).logits - expected).abs().max() > 1e-2


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_peft_prompt_tuning_pools_the_last_real_token(arch):
    """peft prompt tuning feeds inputs_embeds with virtual tokens in front (peft#764)."""
    from peft import PromptTuningConfig, get_peft_model

    results = {}
    for name, model in zip(("stable", "stock"), make_models(arch), strict=True):
        torch.manual_seed(1)
        peft_model = get_peft_model(model, PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=4)).eval()
        sequences = random_sequences(LENGTHS)
        ids, mask = pad_batch(sequences, "right")
        with torch.no_grad():
            try:
                batched = peft_model(input_ids=ids, attention_mask=mask).logits
            except RuntimeError as error:  # Gemma 4 reads per-layer inputs from input_ids: no virtual tokens
                results[name] = str(error).split(".")[0]
                continue
            alone = torch.cat(
                [peft_model(input_ids=s[None], attention_mask=torch.ones(1, len(s))).logits for s in sequences]
            )
        results[name] = (batched - alone).abs().max()
    if isinstance(results["stock"], str):  # the architecture refuses prompt tuning: the Stable class the same way
        assert results["stable"] == results["stock"] and "inputs_embeds" in results["stock"]
        return
    assert results["stable"] <= FP32_TOL
    assert results["stock"] > 1e-2


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_batch_without_pad_token_id(arch):
    """The stock class refuses batch > 1 when config.pad_token_id is None even with a mask (transformers#34055)."""
    stable, stock = make_models(arch, pad_token_id=None)
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, "left", pad_id=5)
    with torch.no_grad():
        assert (stable(ids, attention_mask=mask).logits - logits_alone(stable, sequences)).abs().max() <= FP32_TOL
    with pytest.raises(ValueError, match="no padding token"):
        stock(ids, attention_mask=mask)


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_position_ids_come_from_the_mask(arch):
    """Left padding must not shift the rotary positions of real tokens: the stock class counts pads as positions."""
    stable, _ = make_models(arch)
    seen = []
    rotary = next(
        (
            m
            for m in stable.modules()
            if type(m).__name__.endswith("RotaryEmbedding") and "Vision" not in type(m).__name__
        ),
        None,
    )
    if rotary is not None:
        hook = rotary.register_forward_hook(
            lambda module, args, kwargs, out: seen.append(args[1] if len(args) > 1 else kwargs["position_ids"]),
            with_kwargs=True,
        )
    else:  # learned absolute positions (GPT-2): what the backbone is given
        hook = stable.base_model.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append(kwargs["position_ids"]), with_kwargs=True
        )
    ids, mask = pad_batch(random_sequences([5, 2]), "left")
    with torch.no_grad():
        stable(ids, attention_mask=mask)
    hook.remove()
    positions = seen[0] if seen[0].dim() == 2 else seen[0][0]  # multimodal rope: (axes, batch, sequence)
    assert positions.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1]]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN, ids=ARCH_ATTN_IDS)
def test_bf16_padding_error_is_within_bf16_noise(arch, attn, side):
    """bf16: padding moves the logits by no more than bf16 itself moves the unpadded logits away from fp32."""
    stable32, _ = make_models(arch, attn)
    stable16, _ = make_models(arch, attn, dtype=torch.bfloat16)
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, side)
    alone = logits_alone(stable16, sequences)
    bf16_noise = (alone - logits_alone(stable32, sequences)).abs().max()
    with torch.no_grad():
        padding_error = (stable16(ids, attention_mask=mask).logits - alone).abs().max()
    assert bf16_noise > 0  # the bound is a real bf16 effect, not zero by accident
    assert padding_error <= bf16_noise
