"""The listwise reranker loss: each positive against its group's negatives."""

import torch
import torch.nn.functional as F

from .group_loss import GroupLoss


class ListwiseLoss(GroupLoss):
    """Softmax cross-entropy of each positive against the group's negatives, on scores / temperature (ms-swift's
    listwise reranker, FlagEmbedding's group cross-entropy), averaged over the group's positives."""

    name = "listwise"

    takes_temperature = True

    def __init__(self, temperature: float = 1.0):
        self.temperature = temperature

    def group(self, scores, relevance, teacher):
        positive = relevance > 0
        if not positive.any():
            raise ValueError("ranking_loss: a group without a positive document (relevance > 0)")
        negatives = scores[~positive] / self.temperature
        each = torch.cat([scores[positive, None] / self.temperature, negatives.expand(int(positive.sum()), -1)], 1)
        return -F.log_softmax(each, -1)[:, 0].mean()
