"""A reward model's loss on preference pairs."""

import torch.nn.functional as F


class BradleyTerryLoss:
    """-log sigmoid(r_chosen - r_rejected - margin) + center_rewards * (r_chosen + r_rejected)^2 per pair (TRL's
    RewardTrainer with a `margin` column and `center_rewards_coefficient`), in fp32, averaged over pairs: over the
    pairs of all accumulated micro-batches (and processes) when Trainer passes num_items_in_batch, which counts both
    responses of a pair, so micro-batches add up to the loss of one big batch."""

    def __init__(self, center_rewards: float | None = None):
        self.center_rewards = center_rewards

    def __call__(self, outputs, labels, num_items_in_batch=None, margin=None):
        rewards = outputs["logits"].squeeze(-1).float()
        labels = labels.to(rewards.device)
        chosen, rejected = rewards[labels == 1], rewards[labels == 0]
        if chosen.shape != rejected.shape:
            raise ValueError("bradley_terry_loss: labels must mark each pair's chosen (1) and rejected (0) response.")
        difference = chosen - rejected
        if margin is not None:
            difference = difference - margin.to(difference)
        losses = -F.logsigmoid(difference)
        if self.center_rewards:
            losses = losses + self.center_rewards * (chosen + rejected) ** 2
        if num_items_in_batch is None:
            return losses.mean()
        return losses.sum() / (num_items_in_batch / 2)


def bradley_terry_loss(outputs, labels, num_items_in_batch=None, margin=None, center_rewards=None):
    """`BradleyTerryLoss(center_rewards)` as a function (earlier releases' name)."""
    return BradleyTerryLoss(center_rewards)(outputs, labels, num_items_in_batch, margin)
