"""Contract point 7: bad input gets a ValueError that names the problem and the fix, never NaN or a device assert."""

import pytest
import torch
from architectures import BY_NAME, FIRST_CLASS, VOCAB, make_models, pad_batch, random_sequences


@pytest.fixture(params=FIRST_CLASS, ids=str)
def models(request):
    return make_models(request.param)


def batch():
    return pad_batch(random_sequences([6, 3]), "left")


def test_row_without_tokens(models):
    stable, stock = models
    ids, mask = batch()
    mask[1] = 0
    with pytest.raises(ValueError, match=r"rows \[1\] of attention_mask are all zero.*Drop empty texts"):
        stable(ids, attention_mask=mask)
    stock(ids, attention_mask=mask)  # the stock class classifies a row of padding without complaint


def test_token_ids_outside_the_embedding_table(models):
    stable, stock = models
    ids, mask = batch()
    ids[0, -1] = VOCAB + 7
    with pytest.raises(
        ValueError, match=r"rows \[0\] hold token ids outside the embedding table.*resize_token_embeddings"
    ):
        stable(ids, attention_mask=mask)
    with pytest.raises(IndexError):  # on CUDA this is a device-side assert that kills the process
        stock(ids, attention_mask=mask)


def test_negative_token_ids(models):
    stable, _ = models
    ids, mask = batch()
    ids[1, 0] = -1
    with pytest.raises(ValueError, match=r"rows \[1\] hold token ids"):
        stable(ids, attention_mask=mask)


@pytest.mark.parametrize("label", [3, -2])
def test_labels_outside_num_labels(models, label):
    stable, stock = models
    ids, mask = batch()
    with pytest.raises(ValueError, match=rf"labels \[{label}\] are outside 0..2 \(num_labels=3\)"):
        stable(ids, attention_mask=mask, labels=torch.tensor([0, label]))
    with pytest.raises((IndexError, RuntimeError)):
        stock(ids, attention_mask=mask, labels=torch.tensor([0, label]))


def test_ignored_label_is_allowed(models):
    stable, _ = models
    ids, mask = batch()
    loss = stable(ids, attention_mask=mask, labels=torch.tensor([1, -100])).loss
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "bad_mask",
    [torch.ones(2, 4, dtype=torch.long), torch.ones(3, 6, dtype=torch.long), torch.ones(2, 1, 6, 6, dtype=torch.long)],
    ids=["short", "rows", "4d"],
)
def test_mask_shape_mismatch(models, bad_mask):
    stable, _ = models
    ids, _ = batch()
    with pytest.raises(
        ValueError,
        match=r"attention_mask has (shape .* but the inputs have shape \(2, 6\)|4 positions but the inputs have 6)",
    ):
        stable(ids, attention_mask=bad_mask)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_inputs_embeds(models, value):
    stable, stock = models
    ids, mask = batch()
    with torch.no_grad():
        embeds = stable.get_input_embeddings()(ids)
    embeds[1, 2, 0] = value
    with pytest.raises(ValueError, match=r"rows \[1\] of inputs_embeds contain NaN or inf"):
        stable(inputs_embeds=embeds, attention_mask=mask)
    with torch.no_grad():
        try:
            assert not torch.isfinite(stock(inputs_embeds=embeds, attention_mask=mask).logits).all()
        except RuntimeError as error:  # Gemma 4 reads per-layer inputs from input_ids: it refuses embeddings alone
            assert "inputs_embeds" in str(error)


def test_both_or_neither_of_ids_and_embeds(models):
    stable, _ = models
    ids, mask = batch()
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        stable(attention_mask=mask)


def test_unknown_pooling():
    arch = BY_NAME["gemma2"]
    with pytest.raises(ValueError, match=r"pooling='cls' is not supported; use one of \('last', 'mean'\)"):
        make_models(arch, pooling="cls")
