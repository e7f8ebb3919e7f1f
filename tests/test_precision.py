"""Contract point 4: pooled hidden -> fp32 -> score -> fp32 logits -> fp32 loss, whatever the backbone dtype."""

import math

import pytest
import torch
from architectures import FIRST_CLASS, LORA_TARGETS, attention_layer_count, make_models, pad_batch, random_sequences


def set_margin(model, ids, mask, margin):
    """Make the head output logits (margin, 0, 0) for every row: the true loss is log(1 + 2 e^-margin)."""
    with torch.no_grad():
        pooled = []
        model.score.register_forward_hook(lambda m, args, out: pooled.append(args[0].float()))
        model(ids, attention_mask=mask)
        model.score._forward_hooks.clear()
        direction = pooled[0].mean(0)
        weight = torch.zeros_like(model.score.weight, dtype=torch.float32)
        weight[0] = direction * margin / direction.dot(direction)
        model.score.weight.copy_(weight)


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_score_stays_fp32_when_loaded_in_bf16(arch, tmp_path):
    stable, _ = make_models(arch)
    stable.save_pretrained(tmp_path)
    loaded = arch.stable_class.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.score.weight.dtype == torch.float32
    assert loaded.get_input_embeddings().weight.dtype == torch.bfloat16
    stock = arch.stock_class.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert stock.score.weight.dtype == torch.bfloat16
    loaded.to(torch.bfloat16)
    loaded.half()
    assert loaded.score.weight.dtype == torch.float32
    ids, mask = pad_batch(random_sequences([5, 3]), "left")
    assert loaded(ids, attention_mask=mask).logits.dtype == torch.float32


@pytest.mark.parametrize("margin", [4.0, 10.0])
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_confident_bf16_loss_is_exact(arch, margin):
    """The stock bf16 loss is 0.0 at margin 10 (true 9.1e-5) and 6 % off at margin 4."""
    stable, stock = make_models(arch, dtype=torch.bfloat16)
    seq = random_sequences([6])[0]
    ids, mask = pad_batch([seq, seq], "left")
    labels = torch.tensor([0, 0])
    set_margin(stable, ids, mask, margin)
    stock.score.weight.data.copy_(stable.score.weight.data)
    with torch.no_grad():
        out = stable(ids, attention_mask=mask, labels=labels)
        truth = torch.nn.functional.cross_entropy(out.logits.double(), labels).item()
        stock_loss = stock(ids, attention_mask=mask, labels=labels).loss.float().item()
    assert abs(truth - math.log1p(2 * math.exp(-margin))) / truth < 1e-2  # the head really gives that margin
    assert out.loss.dtype == torch.float32
    assert abs(out.loss.item() - truth) / truth < 1e-3
    assert abs(stock_loss - truth) / truth > 0.05


@pytest.mark.parametrize(
    ("num_labels", "labels", "problem_type", "reference"),
    [
        (3, torch.tensor([0, 2]), "single_label_classification", torch.nn.functional.cross_entropy),
        (
            3,
            torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
            "multi_label_classification",
            torch.nn.functional.binary_cross_entropy_with_logits,
        ),
        (
            1,
            torch.tensor([0.5, -1.25]),
            "regression",
            lambda logits, labels: torch.nn.functional.mse_loss(logits.squeeze(-1), labels),
        ),
    ],
    ids=["single", "multi", "regression"],
)
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_loss_is_fp32_for_every_problem_type(arch, num_labels, labels, problem_type, reference):
    stable, _ = make_models(arch, dtype=torch.bfloat16, num_labels=num_labels)
    ids, mask = pad_batch(random_sequences([6, 3]), "right")
    with torch.no_grad():
        out = stable(ids, attention_mask=mask, labels=labels)
    assert stable.config.problem_type == problem_type
    assert out.logits.dtype == out.loss.dtype == torch.float32
    expected = reference(out.logits.double(), labels.double() if labels.is_floating_point() else labels)
    assert abs(out.loss.item() - expected.item()) <= 1e-6 * max(1.0, expected.item())


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_only_pooled_positions_are_scored(arch):
    stable, _ = make_models(arch)
    shapes = []
    stable.score.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    ids, mask = pad_batch(random_sequences([9, 4]), "left")
    with torch.no_grad():
        stable(ids, attention_mask=mask)
    assert shapes == [(2, stable.config.get_text_config().hidden_size)]


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_head_trains_in_fp32_under_peft_lora(arch):
    from peft import LoraConfig, get_peft_model

    stable, _ = make_models(arch, dtype=torch.bfloat16)
    peft_model = get_peft_model(stable, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=LORA_TARGETS))
    trainable = {name: p for name, p in peft_model.named_parameters() if p.requires_grad}
    head = [name for name in trainable if "score" in name]
    assert head, "peft SEQ_CLS must put score in modules_to_save"
    assert all(trainable[name].dtype == torch.float32 for name in head)
    ids, mask = pad_batch(random_sequences([6, 3]), "left")
    out = peft_model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert out.logits.dtype == torch.float32
    assert all(torch.isfinite(trainable[name].grad).all() for name in head)


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_logits_and_loss_stay_fp32_under_bf16_autocast(arch):
    """Trainer(bf16=True) runs the forward under autocast, which would run the head's matmul in bf16."""
    stable, stock = make_models(arch)
    ids, mask = pad_batch(random_sequences([6, 3]), "left")
    labels = torch.tensor([0, 1])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = stable(ids, attention_mask=mask, labels=labels)
        stock_bf16 = stock(ids, attention_mask=mask).logits
        assert stock_bf16.dtype == torch.bfloat16
    assert out.logits.dtype == out.loss.dtype == torch.float32
    with torch.no_grad():
        exact = stable(ids, attention_mask=mask).logits
        stock_error = (stock_bf16.float() - stock(ids, attention_mask=mask).logits).abs().max()
    # the backbone ran in bf16, the head in fp32: the head adds no rounding of its own
    pooled = []
    stable.score.register_forward_hook(lambda m, args, o: pooled.append(args[0]))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        stable(ids, attention_mask=mask)
    assert torch.equal(out.logits, pooled[0].float() @ stable.score.weight.T)
    # the same bf16 backbone as the stock class: its error is of the size of the stock class's own bf16 error
    assert (out.logits - exact).abs().max() <= 3 * stock_error


# Models that round through fp32 inside their layers whatever the model's dtype: there the fp64 noise of a batched
# kernel (1e-16, which ones depends on the CPU's kernels) becomes fp32 rounding noise (measured on AVX512: 4e-8)
ROUNDS_THROUGH_FP32 = {"llama4_text": "rotary embeddings in complex64: view_as_complex(query.float())"}


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_fp64_model_keeps_an_fp64_head(arch):
    """Padding invariance of real checkpoints is checked in fp64, where only exact handling of padding passes.

    Some of transformers' kernels compute in fp32 whatever the model's dtype: the eager attention's softmax, and the
    gated-delta (linear attention) layers of Qwen3.5, Llama 4's rotary embeddings. fp64 is exact with sdpa and no such
    layers; the others (Gemma2, which refuses sdpa, Qwen3.5, Llama 4) get the fp32 bound."""
    attn = arch.attn_implementations[-1]
    stable, stock = make_models(arch, attn, dtype=torch.float64)
    assert stable.score.weight.dtype == torch.float64
    if getattr(stable, "_can_set_experts_implementation", lambda: False)():  # MoE: as the stock class, grouped_mm
        assert stable.config._experts_implementation == stock.config._experts_implementation
        stable.set_experts_implementation("eager")  # by default, which has no fp64 kernel
    sequences = random_sequences([9, 4, 6])
    ids, mask = pad_batch(sequences, "left")
    with torch.no_grad():
        out = stable(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))
        alone = torch.cat([stable(s[None]).logits for s in sequences])
    assert out.logits.dtype == out.loss.dtype == torch.float64
    exact = attn == "sdpa" and attention_layer_count(stable.config) == stable.config.get_text_config().num_hidden_layers
    exact = exact and arch.name not in ROUNDS_THROUGH_FP32
    assert (out.logits - alone).abs().max() <= (1e-12 if exact else 1e-5)
