"""What serving engines read from a saved checkpoint: pad_token_id in config.json, and the pooling of a mean-pooled
classifier in sentence-transformers files (vLLM), without breaking CrossEncoder / SentenceTransformer loading."""

import json
import warnings

import pytest
import sentence_transformers
import tiny_tokenizers
import torch
from architectures import BY_NAME, make_config, make_models, pad_batch, random_sequences
from transformers import AutoModelForSequenceClassification

QWEN2 = BY_NAME["qwen2"]


def converted_causal_lm(folder, tokenizer):
    """A generative checkpoint whose config has no pad_token_id (as Llama / Qwen2.5 base configs ship), with its
    tokenizer (which has one) in the same folder: what users turn into a classifier."""
    config = make_config(QWEN2, vocab_size=len(tokenizer), pad_token_id=None)
    QWEN2.causal_lm_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def vllm_pooling_config(folder):
    """vLLM's reading of a checkpoint's pooling (vllm/transformers_utils/config.py: get_pooling_config and
    parse_pooling_type): the Pooling module listed in modules.json, each key of its config.json that is true turned
    into a pooling type, use_activation from a Normalize module; None (vLLM's last-token default for classifiers)
    without modules.json."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except FileNotFoundError:
        return None
    pooling = next((m for m in modules if m["type"] == "sentence_transformers.models.Pooling"), None)
    if pooling is None:
        return None
    config = {"use_activation": any(m["type"] == "sentence_transformers.models.Normalize" for m in modules)}
    for key, value in json.loads((folder / pooling["path"] / "config.json").read_text()).items():
        if value is True:
            name = key.replace("pooling_mode_", "").split("_", 1)[0]
            name = ("last" if "lasttoken" in name else name).upper()
            if name in ("CLS", "LAST", "MEAN"):  # vLLM's SEQ_POOLING_TYPES; others are skipped
                config["seq_pooling_type"] = name
    return config


def test_a_converted_checkpoint_saves_the_tokenizers_pad_token_id(tmp_path):
    tokenizer = tiny_tokenizers.qwen2_like()
    source = converted_causal_lm(tmp_path / "lm", tokenizer)
    ids, mask = pad_batch(random_sequences([4, 7], seed=1), "right", pad_id=tokenizer.pad_token_id)

    stock = AutoModelForSequenceClassification.from_pretrained(source, num_labels=3)
    stock.save_pretrained(tmp_path / "stock")
    assert json.loads((tmp_path / "stock" / "config.json").read_text()).get("pad_token_id") is None
    with pytest.raises(ValueError, match="batch sizes > 1"):  # what a batching server then hits
        AutoModelForSequenceClassification.from_pretrained(tmp_path / "stock")(ids, attention_mask=mask)

    stable = QWEN2.stable_class.from_pretrained(source, num_labels=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # found, so no warning
        stable.save_pretrained(tmp_path / "stable")
    assert json.loads((tmp_path / "stable" / "config.json").read_text())["pad_token_id"] == tokenizer.pad_token_id
    served = AutoModelForSequenceClassification.from_pretrained(tmp_path / "stable")  # the stock class, batch 2
    with torch.no_grad():
        torch.testing.assert_close(served(ids, attention_mask=mask).logits, stable(ids, attention_mask=mask).logits)


def test_a_tokenizer_saved_first_into_the_folder_supplies_the_pad_token_id(tmp_path):
    tokenizer = tiny_tokenizers.qwen2_like()
    model = QWEN2.stable_class(make_config(QWEN2, vocab_size=len(tokenizer), pad_token_id=None))
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["pad_token_id"] == tokenizer.pad_token_id


def test_no_tokenizer_anywhere_warns_once_and_names_the_fix(tmp_path):
    model = QWEN2.stable_class(make_config(QWEN2, pad_token_id=None))
    with pytest.warns(UserWarning, match=r"no pad_token_id.*setup_pad_token"):
        model.save_pretrained(tmp_path / "first")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save_pretrained(tmp_path / "second")  # a Trainer checkpoint later: no second warning
    assert json.loads((tmp_path / "first" / "config.json").read_text()).get("pad_token_id") is None


def test_vllm_reads_mean_pooling_from_a_mean_checkpoint_and_last_token_from_a_last_one(tmp_path):
    stable = make_models(QWEN2, pooling="mean")[0]
    stable.save_pretrained(tmp_path / "mean")
    assert vllm_pooling_config(tmp_path / "mean") == {"use_activation": True, "seq_pooling_type": "MEAN"}
    stock = make_models(QWEN2)[1]
    stock.save_pretrained(tmp_path / "stock")
    assert vllm_pooling_config(tmp_path / "stock") is None  # vLLM serves a stock save last-token pooled
    make_models(QWEN2, pooling="last")[0].save_pretrained(tmp_path / "last")
    assert vllm_pooling_config(tmp_path / "last") is None

    # saving a last-pooled model over the mean folder removes the stale mean declaration
    make_models(QWEN2, pooling="last")[0].save_pretrained(tmp_path / "mean")
    assert vllm_pooling_config(tmp_path / "mean") is None
    assert not (tmp_path / "mean" / "1_Pooling").exists()


@pytest.fixture
def mean_folder(tmp_path):
    tokenizer = tiny_tokenizers.qwen2_like()
    model = make_models(QWEN2, pooling="mean", vocab_size=len(tokenizer))[0]
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path, model, tokenizer


PAIRS = [("the film was great", "a fine film"), ("bad", "the plot was thin and the acting worse")]


def test_cross_encoder_loads_a_mean_checkpoint_as_the_stable_class(mean_folder):
    folder, model, tokenizer = mean_folder
    encoder = sentence_transformers.CrossEncoder(str(folder), trust_remote_code=True, device="cpu")
    assert type(encoder.model).__name__ == "StableQwen2ForSequenceClassification"
    assert encoder.model.config.classifier_pooling == "mean"
    batch = tokenizer([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).logits
    scores = encoder.predict(PAIRS, batch_size=2, convert_to_tensor=True, activation_fn=torch.nn.Identity())
    torch.testing.assert_close(scores.float(), expected, atol=1e-5, rtol=1e-5)


def test_sentence_transformer_loads_a_mean_checkpoint_as_a_mean_pooled_embedder(mean_folder):
    folder, model, tokenizer = mean_folder
    embedder = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    texts = ["the film was great", "bad"]
    embeddings = embedder.encode(texts, convert_to_tensor=True)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).float()
    mean = (hidden * weights).sum(1) / weights.sum(1)
    torch.testing.assert_close(embeddings, torch.nn.functional.normalize(mean, dim=-1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["qwen2", "gpt2", "granite"])  # stock Generic, stock legacy, built
def test_config_json_names_the_stock_architecture_and_auto_map_the_stable_class(name, tmp_path):
    """vLLM picks its implementation by `architectures` and refuses a Stable name; transformers with
    trust_remote_code follows auto_map. So the folder names the stock class there, as the stock save does."""
    stable, stock = make_models(BY_NAME[name])
    stable.save_pretrained(tmp_path / "stable")
    stock.save_pretrained(tmp_path / "stock")
    saved = json.loads((tmp_path / "stable" / "config.json").read_text())
    stock_saved = json.loads((tmp_path / "stock" / "config.json").read_text())
    assert saved["architectures"] == stock_saved["architectures"] == [type(stock).__name__]
    assert saved["auto_map"]["AutoModelForSequenceClassification"].endswith("." + type(stable).__name__)
    assert stable.config.architectures == [type(stock).__name__]
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "stable", trust_remote_code=True)
    assert type(loaded).__name__ == type(stable).__name__
    ids = torch.stack(random_sequences([6, 6]))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, stable(ids).logits, atol=1e-5, rtol=1e-5)  # sdpa vs eager
