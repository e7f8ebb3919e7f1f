"""The pointwise reranker loss: each document on its own."""

import torch.nn.functional as F

from .group_loss import GroupLoss


class PointwiseLoss(GroupLoss):
    """Binary cross-entropy of each document, relevance / the group's largest relevance as a soft target."""

    name = "pointwise"

    def group(self, scores, relevance, teacher):
        target = relevance / relevance.max().clamp(min=1e-12)
        return F.binary_cross_entropy_with_logits(scores, target)
