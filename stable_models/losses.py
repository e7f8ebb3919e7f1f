"""Losses computed from a Stable model's fp32 outputs, for `Trainer(compute_loss_func=...)`: exact under gradient
accumulation and across processes, because each divides a sum by Trainer's `num_items_in_batch` (the items of the
whole accumulated batch) instead of averaging each micro-batch.
"""

import torch
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


RANKING_LOSSES = ("listwise", "pointwise", "ranknet", "distillation")


def ranking_loss(
    scores, relevance, group_sizes, kind="listwise", temperature=1.0, teacher=None, num_items_in_batch=None
):
    """A reranker's loss over query groups, in fp32: the mean over groups of each group's loss, or, under gradient
    accumulation and several processes, the sum over this micro-batch's groups divided by `num_items_in_batch`, the
    number of groups in the whole batch, so micro-batches of groups of any size add up to the big batch's loss.

    `scores` (documents,), `relevance` (documents,: 0 for a negative, > 0 for a positive, graded allowed) and
    `group_sizes` (groups,) lay the groups end to end. Per group:
    - listwise: softmax cross-entropy of each positive against the group's negatives, on scores / temperature
      (ms-swift's listwise reranker, FlagEmbedding's group cross-entropy), averaged over the positives;
    - pointwise: binary cross-entropy of each document, relevance / the largest relevance as a soft target;
    - ranknet: -log sigmoid(s_i - s_j) over the pairs whose relevance orders i above j;
    - distillation: KL(softmax(teacher / T) || softmax(scores / T)) over the group (teacher scores per document).
    """
    if kind not in RANKING_LOSSES:
        raise ValueError(f"ranking_loss: kind {kind!r}; use one of {', '.join(RANKING_LOSSES)}")
    if kind == "distillation" and teacher is None:
        raise ValueError("ranking_loss: distillation needs teacher scores, one per document")
    scores, relevance = scores.reshape(-1).float(), relevance.reshape(-1).to(scores.device).float()
    sizes = [int(n) for n in group_sizes]
    if sum(sizes) != scores.numel() or relevance.numel() != scores.numel():
        raise ValueError(
            f"ranking_loss: {scores.numel()} scores, {relevance.numel()} relevances and groups of {sum(sizes)} "
            "documents must agree"
        )
    teachers = (
        teacher.reshape(-1).to(scores.device).float().split(sizes) if teacher is not None else [None] * len(sizes)
    )
    losses = [
        group_loss(s, r, t, kind, temperature)
        for s, r, t in zip(scores.split(sizes), relevance.split(sizes), teachers, strict=True)
    ]
    total = torch.stack(losses).sum()
    return total / (len(sizes) if num_items_in_batch is None else num_items_in_batch)


def group_loss(scores, relevance, teacher, kind, temperature):
    if kind == "pointwise":
        target = relevance / relevance.max().clamp(min=1e-12)
        return F.binary_cross_entropy_with_logits(scores, target)
    if kind == "distillation":
        return F.kl_div(
            F.log_softmax(scores / temperature, -1),
            F.log_softmax(teacher / temperature, -1),
            log_target=True,
            reduction="sum",
        )
    positive = relevance > 0
    if kind == "listwise":
        if not positive.any():
            raise ValueError("ranking_loss: a group without a positive document (relevance > 0)")
        negatives = scores[~positive] / temperature
        each = torch.cat([scores[positive, None] / temperature, negatives.expand(int(positive.sum()), -1)], 1)
        return -F.log_softmax(each, -1)[:, 0].mean()
    above = relevance[:, None] > relevance[None, :]  # ranknet: i should be above j
    if not above.any():
        return scores.sum() * 0.0  # one relevance level: no pair to order
    return -F.logsigmoid(scores[:, None] - scores[None, :])[above].mean()
