"""setup_pad_token on tokenizers with the special-token behaviour of Qwen2, Gemma, SmolLM2/Llama and Llama-3 base."""

import warnings

import pytest
import torch
from architectures import BY_NAME, make_config
from tiny_tokenizers import build, gemma_like, llama_pad_is_eos, no_pad, qwen2_like

from stable_models import setup_pad_token

QWEN2 = BY_NAME["qwen2"]


def tiny_model(tokenizer, pad_token_id=None, vocab=None):
    config = make_config(QWEN2, vocab_size=vocab or len(tokenizer), pad_token_id=pad_token_id)
    return QWEN2.stable_class(config)


def test_qwen2_keeps_its_own_pad_and_fixes_a_config_mismatch():
    tokenizer = qwen2_like()
    model = tiny_model(tokenizer, pad_token_id=2)  # the config says eos, the tokenizer pads with <|endoftext|>
    with pytest.warns(UserWarning, match="pad_token_id was 2, the tokenizer pads with 0"):
        assert setup_pad_token(tokenizer, model) == 0
    assert tokenizer.pad_token == "<|endoftext|>" and model.config.pad_token_id == 0


def test_gemma_keeps_pad_zero_silently():
    tokenizer = gemma_like()
    model = tiny_model(tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert setup_pad_token(tokenizer, model) == 0
    assert tokenizer.padding_side == "left" and model.config.pad_token_id == 0


def test_pad_equal_to_eos_switches_to_a_reserved_token():
    tokenizer = llama_pad_is_eos(reserved=True)
    model = tiny_model(tokenizer)
    with pytest.warns(UserWarning, match="its pad token was eos.*<\\|reserved_special_token_0\\|>"):
        setup_pad_token(tokenizer, model)
    assert tokenizer.pad_token == "<|reserved_special_token_0|>" != tokenizer.eos_token


def test_pad_equal_to_eos_with_no_better_choice_warns_and_explains():
    tokenizer = llama_pad_is_eos()
    model = tiny_model(tokenizer)
    with pytest.warns(UserWarning, match="pad is eos.*Stable classes pool from attention_mask"):
        assert setup_pad_token(tokenizer, model) == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.eos_token_id


def test_no_pad_adds_one_with_the_mean_embedding_and_is_idempotent():
    tokenizer = no_pad()
    model = tiny_model(tokenizer)
    old = model.get_input_embeddings().weight.detach().clone()
    with pytest.warns(UserWarning, match="added '<\\|pad\\|>'.*mean row"):
        pad_id = setup_pad_token(tokenizer, model)
    weight = model.get_input_embeddings().weight
    assert pad_id == len(old) and weight.shape[0] == len(old) + 1
    assert torch.allclose(weight[pad_id], old.mean(0), atol=1e-7)
    assert torch.equal(weight[: len(old)], old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert setup_pad_token(tokenizer, model) == pad_id  # second call: nothing changes
    assert model.get_input_embeddings().weight.shape[0] == len(old) + 1
    batch = tokenizer(["the film", "a very dull plot"], padding=True, return_tensors="pt")
    assert torch.isfinite(model(**batch).logits).all()


def test_a_pad_chosen_before_the_model_is_the_one_chosen_with_it():
    """train tokenizes before it loads the model (its TrainingArguments are built once, from the tokenized tables):
    the tokenizer set up first picks the pad it would pick with the model, and the model's call grows its rows."""
    tokenizer, reference = no_pad(), no_pad()
    model, reference_model = tiny_model(tokenizer), tiny_model(reference)
    reference_model.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pad_id = setup_pad_token(tokenizer, model_follows=True)  # no warning yet: nothing is half done
    with pytest.warns(UserWarning, match="added '<\\|pad\\|>'.*mean row"):
        assert setup_pad_token(tokenizer, model) == pad_id
    with pytest.warns(UserWarning, match="mean row"):
        assert setup_pad_token(reference, reference_model) == pad_id
    assert torch.equal(model.get_input_embeddings().weight, reference_model.get_input_embeddings().weight)
    assert model.config.pad_token_id == pad_id


def test_no_pad_without_a_model_falls_back_to_eos_with_a_warning():
    tokenizer = no_pad()
    with pytest.warns(UserWarning, match="pad is eos"):
        assert setup_pad_token(tokenizer) == tokenizer.eos_token_id


def test_unk_is_preferred_to_eos():
    tokenizer = build(["<s>", "</s>", "<unk>"], bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    with pytest.warns(UserWarning, match="it had no pad token; using unk"):
        assert setup_pad_token(tokenizer) == tokenizer.unk_token_id


def test_pad_id_outside_the_embedding_table():
    tokenizer = qwen2_like()
    tokenizer.add_special_tokens({"pad_token": "<|new-pad|>"})
    model = tiny_model(tokenizer, vocab=len(tokenizer) - 1)
    with pytest.raises(ValueError, match="outside the model's embedding table.*resize_token_embeddings"):
        setup_pad_token(tokenizer, model)


def test_generation_config_follows():
    tokenizer = qwen2_like()
    model = QWEN2.causal_lm_class(make_config(QWEN2, vocab_size=len(tokenizer), pad_token_id=None))
    setup_pad_token(tokenizer, model)
    assert model.config.pad_token_id == model.generation_config.pad_token_id == 0


FIXTURES = [("qwen2", qwen2_like), ("gemma2", gemma_like), ("llama", llama_pad_is_eos), ("llama", no_pad)]


@pytest.mark.parametrize(("arch_name", "fixture"), FIXTURES, ids=lambda x: getattr(x, "__name__", x))
def test_fixture_tokenizers_survive_save_and_auto_tokenizer(arch_name, fixture, tmp_path):
    """A fixture must be what it claims: saved next to its architecture's config, AutoTokenizer gives it back."""
    from transformers import AutoTokenizer

    tokenizer = fixture()
    make_config(BY_NAME[arch_name], vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ["the film was great", "dull", "not good and not bad"]:
        assert reloaded(text).input_ids == tokenizer(text).input_ids
        assert reloaded.decode(reloaded(text).input_ids, skip_special_tokens=True).strip() == text
    assert reloaded.tokenize("the film was great") == tokenizer.tokenize("the film was great")
    assert len(tokenizer.tokenize("the film was great")) == 4  # whole words, not bytes
    assert (reloaded.pad_token, reloaded.eos_token, reloaded.padding_side) == (
        tokenizer.pad_token,
        tokenizer.eos_token,
        tokenizer.padding_side,
    )
