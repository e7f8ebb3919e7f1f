"""The RankNet reranker loss: every ordered pair of a group."""

import torch.nn.functional as F

from .group_loss import GroupLoss


class RankNetLoss(GroupLoss):
    """-log sigmoid(s_i - s_j) over the pairs whose relevance orders i above j, averaged over them (a group with one
    relevance level has none, and adds 0)."""

    name = "ranknet"

    def group(self, scores, relevance, teacher):
        above = relevance[:, None] > relevance[None, :]  # i should be above j
        if not above.any():
            return scores.sum() * 0.0
        return -F.logsigmoid(scores[:, None] - scores[None, :])[above].mean()
