"""Padding-free reward modelling: Bradley-Terry on packed chosen/rejected responses equals the padded run."""

import pytest
import torch
from architectures import BY_NAME, cpu_training_args, make_models, pad_batch, random_sequences
from transformers import Trainer

from stable_models import PackedPairCollator, bradley_terry_loss


def pairs(count, seed):
    sequences = random_sequences([3 + (7 * i) % 17 for i in range(2 * count)], seed=seed)
    return [{"chosen_input_ids": sequences[2 * i], "rejected_input_ids": sequences[2 * i + 1]} for i in range(count)]


def padded_pair_collator(features):
    responses = [r for f in features for r in (f["chosen_input_ids"], f["rejected_input_ids"])]
    ids, mask = pad_batch(responses, "left")
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([1, 0] * len(features))}


def test_packed_pairs_give_the_padded_rewards_and_loss():
    model, _ = make_models(BY_NAME["qwen2"], num_labels=1)
    features = pairs(6, seed=1)
    packed = PackedPairCollator(max_tokens=32)(features)
    padded = padded_pair_collator(features)
    assert packed["input_ids"].numel() < padded["input_ids"].numel()
    with torch.no_grad():
        labels = packed.pop("labels")
        packed_out = model(**packed)
        padded_out = model(**{k: v for k, v in padded.items() if k != "labels"})
    assert (packed_out.logits - padded_out.logits).abs().max() <= 1e-5
    rewards = padded_out.logits.squeeze(-1)
    expected = -torch.nn.functional.logsigmoid(rewards[0::2] - rewards[1::2]).mean()
    assert abs(bradley_terry_loss(packed_out, labels) - expected) <= 1e-6


def test_reward_model_trains_with_trainer_and_packing_equals_padding(tmp_path):
    features = pairs(16, seed=2)
    runs = {}
    for name, collator, accumulation in (
        ("padded", padded_pair_collator, 1),
        ("packed", PackedPairCollator(max_tokens=48), 1),
        ("packed-ga", PackedPairCollator(max_tokens=48), 2),
    ):
        model, _ = make_models(BY_NAME["qwen2"], num_labels=1)
        args = cpu_training_args(
            tmp_path / name,
            per_device_train_batch_size=8 // accumulation,
            gradient_accumulation_steps=accumulation,
            max_steps=3,
            learning_rate=1e-2,
            optim="sgd",
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=features, data_collator=collator, compute_loss_func=bradley_terry_loss
        )
        trainer.train()
        runs[name] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(runs["padded"]) == 3 and all(torch.isfinite(torch.tensor(runs["padded"])))
    assert runs["packed"] == pytest.approx(runs["padded"], rel=1e-5)
    assert runs["packed-ga"] == pytest.approx(runs["padded"], rel=1e-5)


def test_unpaired_labels_are_refused():
    outputs = {"logits": torch.zeros(3, 1)}
    with pytest.raises(ValueError, match="each pair's chosen"):
        bradley_terry_loss(outputs, torch.tensor([1, 0, 1]))
