"""Precision guards (fp16 overflow, low-precision trainable weights) and the non-finite training guard."""

import warnings

import pytest
import torch
from architectures import (
    BY_NAME,
    FIRST_CLASS,
    collate_left,
    cpu_training_args,
    make_models,
    pad_batch,
    random_sequences,
    toy_dataset,
)
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback

from stable_models import NonFiniteError, NonFiniteGuard, StopOnNonFinite


def final_norm(model):
    """The text model's last norm (Llama-style `norm`; GPT-2 `ln_f`; GPT-NeoX `final_layer_norm`)."""
    text_model = next((m for m in model.modules() if hasattr(m, "embed_tokens") and hasattr(m, "norm")), None)
    if text_model is not None:
        return text_model.norm
    return [child for name, child in model.base_model.named_children() if "norm" in name or name == "ln_f"][-1]


def overflowing_models(arch):
    """Stable and stock models whose fp32 activations exceed fp16's 65504 while every weight still fits in fp16."""
    stable, stock = make_models(arch)
    with torch.no_grad():
        for model in (stable, stock):  # scale the text model's final norm: its output is what the head reads
            final_norm(model).weight.fill_(6e4)
    ids, mask = pad_batch(random_sequences([7, 4]), "left")
    with torch.no_grad():
        hidden = stable.base_model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert max(h.abs().max().item() for h in hidden) > 65504
    assert max(p.abs().max().item() for p in stable.parameters()) < 65504
    return stable.half(), stock.half(), ids, mask


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_fp16_overflow_raises_instead_of_returning_nan(arch):
    stable, stock, ids, mask = overflowing_models(arch)
    with torch.no_grad():
        assert not torch.isfinite(stock(ids, attention_mask=mask).logits).all()  # the stock class: silent NaN/inf
        with pytest.raises(ValueError, match="overflowed in float16.*dtype=torch.bfloat16"):
            stable(ids, attention_mask=mask)


def adamw_changed_fraction(dtype, steps=3, lr=1e-6):
    stable, _ = make_models(BY_NAME["qwen2"], dtype=dtype)
    stable.train()
    before = stable.model.layers[0].mlp.up_proj.weight.detach().clone()
    optimizer = torch.optim.AdamW(stable.parameters(), lr=lr)
    ids, mask = pad_batch(random_sequences([6, 4]), "right")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            stable(ids, attention_mask=mask, labels=torch.tensor([0, 1])).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return (stable.model.layers[0].mlp.up_proj.weight != before).float().mean().item()


def test_bf16_weights_swallow_small_adamw_updates():
    """Why the warning below exists: at lr 1e-6 most bf16 weights never move, fp32 ones all do."""
    assert adamw_changed_fraction(torch.bfloat16) < 0.2
    assert adamw_changed_fraction(torch.float32) > 0.9


def test_low_precision_trainables_warn_once_at_the_first_training_step():
    stable, _ = make_models(BY_NAME["qwen2"], dtype=torch.bfloat16)
    stable.train()
    ids, mask = pad_batch(random_sequences([6, 4]), "right")
    with pytest.warns(UserWarning, match="stored in torch.bfloat16 without fp32 master weights.*LoRA") as record:
        stable(ids, attention_mask=mask, labels=torch.tensor([0, 1])).loss.backward()
    assert len([w for w in record if "master weights" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stable(ids, attention_mask=mask, labels=torch.tensor([0, 1]))  # once only


@pytest.mark.parametrize("setup", ["fp32", "bf16-eval", "bf16-lora"])
def test_no_low_precision_warning_when_it_does_not_apply(setup):
    from peft import LoraConfig, get_peft_model

    stable, _ = make_models(BY_NAME["qwen2"], dtype=torch.float32 if setup == "fp32" else torch.bfloat16)
    model = get_peft_model(stable, LoraConfig(task_type="SEQ_CLS", r=4)) if setup == "bf16-lora" else stable
    model.train(setup != "bf16-eval")
    ids, mask = pad_batch(random_sequences([6, 4]), "right")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1]))


class PoisonStep(TrainerCallback):
    """From `step` on, layer 1 outputs NaN (a stand-in for an overflow or a bad kernel)."""

    def __init__(self, model, step):
        self.step, self.active = step, False
        model.model.layers[1].register_forward_hook(self.poison)

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 >= self.step

    def poison(self, module, args, output):
        if not self.active:
            return output
        if isinstance(output, tuple):
            return (torch.full_like(output[0], float("nan")), *output[1:])
        return torch.full_like(output, float("nan"))


def train_with_poison(tmp_path, guard: bool):
    model = make_models(BY_NAME["qwen2"])[0]
    args = cpu_training_args(
        tmp_path,
        per_device_train_batch_size=4,
        max_steps=5,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=1,
    )
    callbacks = [PoisonStep(model, step=3)] + ([StopOnNonFinite()] if guard else [])
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=toy_dataset([3 + i % 5 for i in range(24)], seed=2),
        data_collator=collate_left,
        callbacks=callbacks,
    )
    return trainer


def checkpoint_is_finite(folder):
    return all(torch.isfinite(t).all() for t in load_file(folder / "model.safetensors").values())


def test_guard_stops_at_the_first_nan_and_names_step_batch_and_module(tmp_path):
    with pytest.raises(NonFiniteError) as error:
        train_with_poison(tmp_path, guard=True).train()
    message = str(error.value)
    assert "step 3: loss is nan" in message
    assert "first non-finite output: model.layers.1" in message
    assert "lengths [" in message and "padding left" in message and "dtype torch.float32" in message
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert all(checkpoint_is_finite(p) for p in tmp_path.glob("checkpoint-*"))


def test_without_the_guard_nan_reaches_the_saved_weights(tmp_path):
    train_with_poison(tmp_path, guard=False).train()  # the stock Trainer carries on
    assert not checkpoint_is_finite(tmp_path / "checkpoint-5")


def test_guard_in_a_custom_loop_catches_a_non_finite_gradient():
    stable, _ = make_models(BY_NAME["gemma2"])
    stable.train()
    guard = NonFiniteGuard(stable)
    ids, mask = pad_batch(random_sequences([6, 4]), "right")
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1])}
    loss = stable(**batch).loss
    guard.check_loss(loss, batch, step=7)
    loss.backward()
    stable.score.weight.grad[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="step 7: the gradient of score.weight is not finite.*padding right"):
        guard.check_gradients(step=7)
