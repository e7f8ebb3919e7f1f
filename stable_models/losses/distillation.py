"""The distillation reranker loss: a teacher's scores over each group."""

import torch.nn.functional as F

from .group_loss import GroupLoss


class DistillationLoss(GroupLoss):
    """KL(softmax(teacher / T) || softmax(scores / T)) over each group (FlagEmbedding's `pos_scores` / `neg_scores`)."""

    name = "distillation"
    needs_teacher = True

    takes_temperature = True

    def __init__(self, temperature: float = 1.0):
        self.temperature = temperature

    def group(self, scores, relevance, teacher):
        return F.kl_div(
            F.log_softmax(scores / self.temperature, -1),
            F.log_softmax(teacher / self.temperature, -1),
            log_target=True,
            reduction="sum",
        )
