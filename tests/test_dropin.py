"""Contract point 8: same constructor, from_pretrained, attributes, outputs and features as the stock class."""

import json

import pytest
import torch
from architectures import (
    ARCH_ATTN,
    ARCH_ATTN_IDS,
    FIRST_CLASS,
    VOCAB,
    attention_layer_count,
    make_config,
    make_models,
    pad_batch,
    random_sequences,
)


@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN, ids=ARCH_ATTN_IDS)
def test_unpadded_logits_equal_the_stock_class(arch, attn):
    stable, stock = make_models(arch, attn)
    ids = torch.stack(random_sequences([7, 7, 7]))
    with torch.no_grad():
        assert (stable(ids).logits - stock(ids).logits).abs().max() <= 1e-5
        ones = torch.ones_like(ids)
        assert (stable(ids, attention_mask=ones).logits - stock(ids, attention_mask=ones).logits).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_same_constructor_attributes_and_state_dict(arch):
    stable = arch.stable_class(make_config(arch))
    stock = arch.stock_class(make_config(arch))
    assert isinstance(stable, arch.stock_class)
    assert type(stable.base_model) is type(stock.base_model)
    assert isinstance(stable.score, torch.nn.Linear)
    assert stable.state_dict().keys() == stock.state_dict().keys()
    assert stable.config.classifier_pooling == "last"
    assert stable.config.model_type == arch.name


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_from_pretrained_of_a_causal_lm_checkpoint(arch, tmp_path):
    torch.manual_seed(0)
    causal = arch.causal_lm_class(make_config(arch))
    causal.save_pretrained(tmp_path)
    stable = arch.stable_class.from_pretrained(tmp_path, num_labels=4, dtype=torch.bfloat16)
    assert stable.score.weight.shape == (4, stable.config.get_text_config().hidden_size)
    assert stable.score.weight.dtype == torch.float32
    assert stable.score.weight.std() > 0  # newly initialised, not zeros
    assert torch.equal(stable.get_input_embeddings().weight, causal.get_input_embeddings().weight.to(torch.bfloat16))


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_pooling_is_a_from_pretrained_argument_saved_in_config(arch, tmp_path):
    stable, _ = make_models(arch)
    stable.save_pretrained(tmp_path / "last")
    mean = arch.stable_class.from_pretrained(tmp_path / "last", pooling="mean")
    assert mean.config.classifier_pooling == "mean"
    mean.save_pretrained(tmp_path / "mean")
    assert json.loads((tmp_path / "mean" / "config.json").read_text())["classifier_pooling"] == "mean"
    assert arch.stable_class.from_pretrained(tmp_path / "mean").config.classifier_pooling == "mean"


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_tuple_outputs_hidden_states_and_attentions(arch):
    stable, stock = make_models(arch)
    ids, mask = pad_batch(random_sequences([6, 3]), "right")
    labels = torch.tensor([0, 1])
    with torch.no_grad():
        loss, logits = stable(ids, attention_mask=mask, labels=labels, return_dict=False)[:2]
        assert logits.shape == (2, 3) and loss.ndim == 0
        out = stable(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        ref = stock(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == stable.config.get_text_config().num_hidden_layers + 1
    assert len(out.attentions) == len(ref.attentions) == attention_layer_count(stable.config)
    assert out.attentions[0].shape == ref.attentions[0].shape


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_gradient_checkpointing_gives_the_same_gradients(arch):
    ids, mask = pad_batch(random_sequences([6, 3]), "left")
    grads = []
    for checkpointing in (False, True):
        stable, _ = make_models(arch)
        stable.train()
        if checkpointing:
            stable.gradient_checkpointing_enable()
        stable(ids, attention_mask=mask, labels=torch.tensor([0, 2])).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in stable.parameters() if p.grad is not None]))
    assert grads[0].numel() == grads[1].numel()
    assert (grads[0] - grads[1]).abs().max() <= 1e-6


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_resize_token_embeddings(arch):
    stable, _ = make_models(arch)
    stable.resize_token_embeddings(VOCAB + 8)
    ids, mask = pad_batch([torch.tensor([5, VOCAB + 3, 7]), torch.tensor([VOCAB + 7])], "left")
    with torch.no_grad():
        assert torch.isfinite(stable(ids, attention_mask=mask).logits).all()


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_ignore_mismatched_sizes(arch, tmp_path):
    stable, _ = make_models(arch)
    stable.save_pretrained(tmp_path)
    reloaded = arch.stable_class.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert reloaded.score.weight.shape == (5, stable.config.get_text_config().hidden_size)
    assert reloaded.score.weight.dtype == torch.float32
    assert torch.equal(reloaded.get_input_embeddings().weight, stable.get_input_embeddings().weight)


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_stable_checkpoint_reloads_identically(arch, tmp_path):
    stable, _ = make_models(arch, pooling="mean")
    stable.save_pretrained(tmp_path)
    reloaded = arch.stable_class.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, mask = pad_batch(random_sequences([6, 3]), "left")
    with torch.no_grad():
        assert torch.equal(stable(ids, attention_mask=mask).logits, reloaded(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_peft_lora_seq_cls_defaults(arch):
    """peft keys its default LoRA targets on model_type: the Stable class gets exactly what the stock class gets,
    including peft's refusal where it has no defaults for the architecture (then both need target_modules)."""
    from peft import LoraConfig, get_peft_model

    stable, stock = make_models(arch)
    wrapped = {}
    for name, model in (("stable", stable), ("stock", stock)):
        try:
            peft_model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4))
        except ValueError as error:  # peft has no default target modules for this model type
            wrapped[name] = type(error)
        else:
            wrapped[name] = sorted(n for n, p in peft_model.named_parameters() if p.requires_grad)
    assert wrapped["stable"] == wrapped["stock"]
    if isinstance(wrapped["stable"], type):
        peft_model = get_peft_model(
            make_models(arch)[0], LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["o_proj"])
        )
        wrapped["stable"] = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert any("score.modules_to_save" in n for n in wrapped["stable"])
    assert any("lora_A" in n for n in wrapped["stable"])


def test_importing_the_package_changes_nothing_global():
    import subprocess
    import sys

    probe = (
        "import transformers, transformers.models.auto.modeling_auto as m;"
        "from transformers import AttentionInterface;"
        "before=(dict(m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES), sorted(AttentionInterface._global_mapping),"
        " transformers.Qwen2ForSequenceClassification.forward, transformers.Gemma2ForSequenceClassification.forward,"
        " len(m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING._extra_content));"
        "import stable_models;"
        "after=(dict(m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES), sorted(AttentionInterface._global_mapping),"
        " transformers.Qwen2ForSequenceClassification.forward, transformers.Gemma2ForSequenceClassification.forward,"
        " len(m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING._extra_content));"
        "assert before == after, (before, after)"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)
