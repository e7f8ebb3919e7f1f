"""Losses computed from a Stable model's fp32 outputs, for `Trainer(compute_loss_func=...)`: exact under gradient
accumulation and across processes, because each divides a sum by Trainer's `num_items_in_batch` (the items of the
whole accumulated batch) instead of averaging each micro-batch.
"""

import torch.nn.functional as F


def bradley_terry_loss(outputs, labels, num_items_in_batch=None, margin=None, center_rewards=None):
    """-log sigmoid(r_chosen - r_rejected - margin) + center_rewards * (r_chosen + r_rejected)^2 per pair (TRL's
    RewardTrainer with a `margin` column and `center_rewards_coefficient`), in fp32, averaged over pairs: over the
    pairs of all accumulated micro-batches (and processes) when Trainer passes num_items_in_batch, which counts both
    responses of a pair, so micro-batches add up to the loss of one big batch."""
    rewards = outputs["logits"].squeeze(-1).float()
    labels = labels.to(rewards.device)
    chosen, rejected = rewards[labels == 1], rewards[labels == 0]
    if chosen.shape != rejected.shape:
        raise ValueError("bradley_terry_loss: labels must mark each pair's chosen (1) and rejected (0) response.")
    difference = chosen - rejected
    if margin is not None:
        difference = difference - margin.to(difference)
    losses = -F.logsigmoid(difference)
    if center_rewards:
        losses = losses + center_rewards * (chosen + rejected) ** 2
    if num_items_in_batch is None:
        return losses.mean()
    return losses.sum() / (num_items_in_batch / 2)
