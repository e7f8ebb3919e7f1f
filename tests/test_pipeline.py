"""pipeline("text-classification") with a Stable folder: right answers, and no false error in the log."""

import logging

import pytest
import torch
from architectures import BY_NAME, make_config
from tiny_tokenizers import qwen2_like
from transformers import pipeline

import stable_models


@pytest.fixture(params=["left", "right"])
def folder(tmp_path, request):
    tokenizer = qwen2_like()
    torch.manual_seed(0)
    config = make_config(BY_NAME["qwen2"], vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    stable_models.StableQwen2ForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path, request.param


def test_pipeline_is_quiet_and_batching_changes_nothing(folder, caplog):
    folder, padding_side = folder
    texts = ["the film was great", "dull", "not good and not bad", "i loved it"]
    with caplog.at_level(logging.WARNING, logger="transformers"):
        classify = pipeline("text-classification", model=str(folder), trust_remote_code=True, top_k=None)
        classify.tokenizer.padding_side = padding_side
        batched = classify(texts, batch_size=4)
    assert type(classify.model).__name__ == "StableQwen2ForSequenceClassification"
    assert not [r for r in caplog.records if "is not supported for" in r.getMessage()]
    alone = [classify(text)[0] if isinstance(classify(text)[0], list) else classify(text) for text in texts]
    for one, many in zip(alone, batched, strict=True):
        assert {d["label"]: round(d["score"], 5) for d in one} == {d["label"]: round(d["score"], 5) for d in many}


def test_the_filter_hides_only_the_false_error_about_stable_classes(caplog):
    from stable_models.modeling_stable import hide_false_pipeline_error

    hide_false_pipeline_error()
    logger = logging.getLogger("transformers.pipelines.base")
    with caplog.at_level(logging.ERROR, logger="transformers.pipelines.base"):
        logger.error("The model 'StableQwen2ForSequenceClassification' is not supported for text-classification.")
        logger.error("The model 'BertForMaskedLM' is not supported for text-classification.")
    assert [r.getMessage()[:26] for r in caplog.records] == ["The model 'BertForMaskedLM"]
