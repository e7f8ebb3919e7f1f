"""Losses computed from a Stable model's fp32 outputs, as objects that hold their options (sentence-transformers'
pattern), one per file: the Trainers take one as `loss=`, and each is also a `Trainer(compute_loss_func=...)`. Each is
exact under gradient accumulation and across processes, because it divides a sum by Trainer's `num_items_in_batch`
(the items of the whole accumulated batch) instead of averaging each micro-batch.

- `BradleyTerryLoss` (reward models, pairs); `ListwiseLoss`, `PointwiseLoss`, `RankNetLoss`, `DistillationLoss`
  (rerankers, query groups: `group_loss.GroupLoss`); `InfoNCELoss` (embedding models: queries against the batch).
- The functions of earlier releases keep working: `bradley_terry_loss`, `ranking_loss(kind=...)`.
"""

from .bradley_terry import BradleyTerryLoss, bradley_terry_loss
from .distillation import DistillationLoss
from .group_loss import GroupLoss
from .info_nce import InfoNCELoss
from .listwise import ListwiseLoss
from .pointwise import PointwiseLoss
from .ranknet import RankNetLoss

# a reranker's losses by the name `--loss` and `RankingTrainer(loss=...)` take
RANKING_LOSS_CLASSES = {
    "listwise": ListwiseLoss,
    "pointwise": PointwiseLoss,
    "ranknet": RankNetLoss,
    "distillation": DistillationLoss,
}
RANKING_LOSSES = tuple(RANKING_LOSS_CLASSES)


def ranking_loss_named(kind: str, temperature: float = 1.0) -> GroupLoss:
    """The reranker loss `kind` (one of RANKING_LOSSES), holding its temperature where it has one."""
    if kind not in RANKING_LOSS_CLASSES:
        raise ValueError(f"ranking_loss: kind {kind!r}; use one of {', '.join(RANKING_LOSSES)}")
    loss_class = RANKING_LOSS_CLASSES[kind]
    return loss_class(temperature) if loss_class.takes_temperature else loss_class()


def ranking_loss(
    scores, relevance, group_sizes, kind="listwise", temperature=1.0, teacher=None, num_items_in_batch=None
):
    """A reranker's loss over query groups (`GroupLoss`): the mean over groups of each group's loss, or the sum over
    this micro-batch's groups divided by `num_items_in_batch`, the groups of the whole batch."""
    return ranking_loss_named(kind, temperature).of_scores(scores, relevance, group_sizes, teacher, num_items_in_batch)


__all__ = [
    "BradleyTerryLoss",
    "DistillationLoss",
    "GroupLoss",
    "InfoNCELoss",
    "ListwiseLoss",
    "PointwiseLoss",
    "RANKING_LOSSES",
    "RankNetLoss",
    "bradley_terry_loss",
    "ranking_loss",
    "ranking_loss_named",
]
