"""`StableTrainer`: transformers' Trainer, with class-weighted losses exact under gradient accumulation and DDP.

A weighted mean cross-entropy divides by the total class weight of the labels in the batch. Under gradient
accumulation (or across processes) the batch is spread over micro-batches, and Trainer tells the model only how many
labels the whole batch holds. StableTrainer also counts their total weight, across processes when Trainer averages
over them, and passes it to the forward as `label_weight_total`: the micro-batch losses then add up to
`F.cross_entropy(weight=class_weights, label_smoothing=...)` on the one big batch. Everything else is Trainer's.

`PairwiseTrainer` is the same for reward models: the Bradley-Terry loss on pairs, with margins and centering.
`RankingTrainer` for rerankers: a `losses.GroupLoss` over query groups, divided by the groups of the whole batch.
Both take their loss as an object that holds its options (`loss=`), built once; each step hands it the batch's own
inputs (margins, group sizes, teacher scores).
"""

import torch
from transformers import Trainer

from .losses import BradleyTerryLoss, GroupLoss, ranking_loss_named
from .modeling_loss import total_class_weight


class StableTrainer(Trainer):
    """`Trainer` that passes the total class weight of each accumulated batch to a Stable model with class_weights."""

    _label_weight_total = None

    def _get_num_items_in_batch(self, batch_samples, device):
        count = super()._get_num_items_in_batch(batch_samples, device)
        weights = getattr(self.model.config, "class_weights", None)
        self._label_weight_total = None
        if (
            count is None
            or weights is None
            or self.model.config.problem_type not in (None, "single_label_classification")
        ):
            return count
        total = sum(total_class_weight(batch["labels"], weights).to(device) for batch in batch_samples)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            total = self.accelerator.gather(total).sum()  # as Trainer gathers the count
        self._label_weight_total = total
        return count

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self._label_weight_total is not None and num_items_in_batch is not None:
            inputs = {**inputs, "label_weight_total": self._label_weight_total}
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


class PairwiseTrainer(StableTrainer):
    """StableTrainer for reward models on pairs (`PackedPairCollator`): the Bradley-Terry loss with each pair's
    `margin` from the batch and `center_rewards` (TRL's center_rewards_coefficient), exact under gradient
    accumulation and across processes (Trainer's num_items_in_batch, which counts two responses per pair)."""

    def __init__(self, *args, loss: BradleyTerryLoss | None = None, center_rewards: float | None = None, **kwargs):
        self.loss = loss or BradleyTerryLoss(center_rewards)
        self._batch = {}  # this step's inputs for the loss, not for the model
        super().__init__(*args, compute_loss_func=self.batch_loss, **kwargs)

    def batch_loss(self, outputs, labels, num_items_in_batch=None):
        return self.loss(outputs, labels, num_items_in_batch, **self._batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._batch = {"margin": inputs.pop("margin", None)}  # the model takes no margin: the loss does
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """One row per pair, (r_chosen, r_rejected): Trainer's evaluation keeps as many rows as the eval set has
        examples (pairs), so two rows per pair would lose the last batch's second half."""
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if logits is not None:
            logits = logits.reshape(-1, 2)  # the collators' order: chosen_0, rejected_0, chosen_1, ...
            labels = None if labels is None else labels.reshape(-1, 2)[:, 0]
        return loss, logits, labels


class RankingTrainer(StableTrainer):
    """StableTrainer for rerankers on query groups (`PackedGroupCollator`): `loss`, a `losses.GroupLoss` (or its
    name: listwise, pointwise, ranknet, distillation, with `temperature`), averaged over groups. Trainer's
    `num_items_in_batch` counts the groups of every accumulated micro-batch (and process), so groups of any size add
    up to the loss of the one big batch. Evaluation gives one row per group: its documents' scores and relevances,
    padded with NaN and -100 to `group_width` (the widest eval group), so every batch's rows line up."""

    def __init__(self, *args, loss: GroupLoss | str = "listwise", temperature: float = 1.0, group_width=None, **kwargs):
        self.loss = ranking_loss_named(loss, temperature) if isinstance(loss, str) else loss
        self.group_width, self._batch = group_width, {}
        super().__init__(*args, compute_loss_func=self.batch_loss, **kwargs)

    def batch_loss(self, outputs, labels, num_items_in_batch=None):
        return self.loss(outputs, labels, num_items_in_batch, **self._batch)

    def _get_num_items_in_batch(self, batch_samples, device):
        count = torch.tensor(sum(len(batch["group_sizes"]) for batch in batch_samples), device=device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            count = self.accelerator.gather(count).sum()
        self._label_weight_total = None
        return count

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._batch = {"group_sizes": inputs.pop("group_sizes"), "teacher": inputs.pop("teacher", None)}
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        sizes = inputs["group_sizes"].tolist()
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if logits is not None:
            width = self.group_width or max(sizes)
            logits = pad_groups(logits.reshape(-1).float(), sizes, width, float("nan"))
            labels = None if labels is None else pad_groups(labels.reshape(-1).float(), sizes, width, -100.0)
        return loss, logits, labels


def pad_groups(values, sizes, width, fill):
    rows = values.new_full((len(sizes), width), fill)
    for row, part in enumerate(values.split(sizes)):
        rows[row, : len(part)] = part
    return rows
