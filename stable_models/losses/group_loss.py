"""What every reranker loss shares: query groups laid end to end, a loss per group, divided by the groups of the
whole batch."""

import torch


class GroupLoss:
    """A loss over query groups, in fp32. `scores` (documents,), `relevance` (documents,: 0 for a negative, > 0 for a
    positive, graded allowed) and `group_sizes` (groups,) lay the groups end to end; `teacher` scores per document
    where the loss distils. The result is the mean over groups of `group(scores, relevance, teacher)`, or, under
    gradient accumulation and several processes, the sum over this micro-batch's groups divided by
    `num_items_in_batch`, the number of groups in the whole batch, so micro-batches of groups of any size add up to
    the big batch's loss."""

    name = ""
    needs_teacher = False
    takes_temperature = False  # its constructor takes one: scores (and a teacher's) are divided by it

    def group(self, scores, relevance, teacher):
        raise NotImplementedError

    def __call__(self, outputs, labels, num_items_in_batch=None, group_sizes=None, teacher=None):
        """As `Trainer(compute_loss_func=...)` calls a loss, with the batch's `group_sizes` (and `teacher`)."""
        return self.of_scores(outputs["logits"], labels, group_sizes, teacher, num_items_in_batch)

    def of_scores(self, scores, relevance, group_sizes, teacher=None, num_items_in_batch=None):
        if self.needs_teacher and teacher is None:
            raise ValueError(f"ranking_loss: {self.name} needs teacher scores, one per document")
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
            self.group(s, r, t) for s, r, t in zip(scores.split(sizes), relevance.split(sizes), teachers, strict=True)
        ]
        total = torch.stack(losses).sum()
        return total / (len(sizes) if num_items_in_batch is None else num_items_in_batch)
