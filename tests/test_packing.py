"""Padding-free packed batches: every example gets its unpadded logits, and the loss equals the padded batch's."""

import pytest
import torch
from architectures import (
    ARCH_ATTN,
    ARCH_ATTN_IDS,
    BY_NAME,
    FIRST_CLASS,
    attention_layer_count,
    cpu_training_args,
    has_recurrent_layers,
    logits_alone,
    make_models,
    pad_batch,
    random_sequences,
    toy_dataset,
)
from test_masks import RECORDED, probes  # noqa: F401  (the fixture registers the recording probe)
from transformers import Trainer

from stable_models import PackedCollator

LENGTHS = [9, 4, 6, 1, 5]


def packed(sequences, labels=None):
    features = [
        {"input_ids": s} | ({"labels": labels[i]} if labels is not None else {}) for i, s in enumerate(sequences)
    ]
    return PackedCollator()(features)


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN, ids=ARCH_ATTN_IDS)
def test_packed_logits_and_loss(arch, attn, pooling):
    stable, stock = make_models(arch, attn, pooling=pooling)
    sequences = random_sequences(LENGTHS)
    labels = torch.tensor([0, 1, 2, 1, 0])
    batch = packed(sequences, labels)
    assert batch["input_ids"].shape == (1, sum(LENGTHS)) and "attention_mask" not in batch
    if has_recurrent_layers(arch):  # the recurrent state crosses example boundaries: refuse, do not mislead
        with torch.no_grad():
            hidden = stock.model(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state[0]
            alone = stock.model(sequences[1][None]).last_hidden_state[0, -1]
        assert (hidden[LENGTHS[0] + LENGTHS[1] - 1] - alone).abs().max() > 1e-3  # the stock backbone leaks
        with pytest.raises(ValueError, match="state runs along the whole row.*Pad instead of packing"):
            stable(**batch)
        return
    with torch.no_grad():
        out = stable(**batch)
        ids, mask = pad_batch(sequences, "left")
        padded_loss = stable(ids, attention_mask=mask, labels=labels).loss
    assert out.logits.shape == (len(LENGTHS), 3)
    assert (out.logits - logits_alone(stable, sequences)).abs().max() <= 1e-5
    assert abs(out.loss - padded_loss) <= 1e-5


@pytest.mark.parametrize("arch", [a for a in FIRST_CLASS if not has_recurrent_layers(a)], ids=str)  # others refuse
def test_packed_masks_are_block_diagonal_without_empty_rows(arch):
    stable, _ = make_models(arch)
    sequences = random_sequences(LENGTHS)
    batch = packed(sequences)
    RECORDED.clear()
    stable.set_attn_implementation("recording_probe")
    with torch.no_grad():
        stable(**batch)
    masks = list(RECORDED)
    example = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    same_example = example[:, None] == example[None, :]
    assert len(masks) == attention_layer_count(stable.config)
    for layer_mask in masks:
        assert layer_mask is not None and layer_mask.any(-1).all()
        assert not (layer_mask[0, 0] & ~same_example).any(), "attention crosses examples"


def test_trainer_with_the_packing_collator(tmp_path):
    dataset = toy_dataset([3 + i % 7 for i in range(16)], seed=4)
    args = cpu_training_args(
        tmp_path,
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=1e-3,
    )
    model = make_models(BY_NAME["qwen2"])[0]
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=PackedCollator())
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_empty_example_is_refused():
    with pytest.raises(ValueError, match="an example has no tokens"):
        PackedCollator()([{"input_ids": [5, 6]}, {"input_ids": []}])
