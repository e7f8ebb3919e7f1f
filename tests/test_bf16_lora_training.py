"""LoRA bf16 training on padded batches: finite at every step, and the loss goes down."""

import pytest
import torch
from architectures import FIRST_CLASS, LORA_TARGETS, make_models, pad_batch, random_sequences
from peft import LoraConfig, get_peft_model

STEPS = 60


def toy_batch(step, side):
    """Label = which third of the vocabulary the text's last token falls in; lengths vary so rows are padded."""
    lengths = [(step * 3 + i * 5) % 9 + 2 for i in range(6)]
    sequences = random_sequences(lengths, seed=step)
    labels = torch.tensor([min(int(s[-1]) * 3 // 96, 2) for s in sequences])
    return (*pad_batch(sequences, side), labels)


@pytest.mark.trains
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_lora_bf16_loss_decreases(arch):
    stable, _ = make_models(arch, dtype=torch.bfloat16)
    model = get_peft_model(stable, LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=LORA_TARGETS))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for step in range(STEPS):
        ids, mask, labels = toy_batch(step % 10, "left" if step % 2 else "right")
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads if g is not None), step
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first, losses
