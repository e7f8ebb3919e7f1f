"""The reranker losses (stable_models.losses.ranking_loss): each equals its textbook form on a group, and the loss of a
batch of groups of different sizes is the same whole or split into micro-batches (num_items_in_batch = groups)."""

import math

import pytest
import torch
import torch.nn.functional as F

from stable_models.losses import RANKING_LOSSES, ranking_loss

SIZES = [3, 5, 2, 4]  # documents per group, of different sizes
RELEVANCE = torch.tensor([1, 0, 0, 0, 2, 0, 1, 3, 1, 0, 0, 1, 0, 2], dtype=torch.float32)


def scores_and_teacher(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sum(SIZES), generator=generator), torch.randn(sum(SIZES), generator=generator)


def test_listwise_is_cross_entropy_of_each_positive_against_the_negatives():
    scores = torch.tensor([2.0, 0.5, -1.0, 0.3])
    relevance = torch.tensor([1.0, 0.0, 0.0, 1.0])
    got = ranking_loss(scores, relevance, [4], "listwise", temperature=0.5)
    first = F.cross_entropy(torch.tensor([[2.0, 0.5, -1.0]]) / 0.5, torch.tensor([0]))
    second = F.cross_entropy(torch.tensor([[0.3, 0.5, -1.0]]) / 0.5, torch.tensor([0]))
    assert got.item() == pytest.approx(((first + second) / 2).item(), rel=1e-6)


def test_pointwise_is_binary_cross_entropy_with_graded_relevance_as_soft_targets():
    scores = torch.tensor([1.0, -2.0, 0.5])
    got = ranking_loss(scores, torch.tensor([3.0, 0.0, 1.0]), [3], "pointwise")
    expected = F.binary_cross_entropy_with_logits(scores, torch.tensor([1.0, 0.0, 1 / 3]))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_ranknet_averages_the_pairs_the_relevance_orders():
    scores = torch.tensor([1.0, -2.0, 0.5])
    got = ranking_loss(scores, torch.tensor([2.0, 0.0, 1.0]), [3], "ranknet")
    pairs = [(0, 1), (0, 2), (2, 1)]  # (higher, lower)
    expected = sum(-math.log(1 / (1 + math.exp(-(scores[i] - scores[j]).item()))) for i, j in pairs) / 3
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_distillation_is_the_kl_divergence_from_the_teacher():
    scores, teacher = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.2, 0.1, 3.0])
    got = ranking_loss(scores, torch.zeros(3), [3], "distillation", temperature=2.0, teacher=teacher)
    p, q = (teacher / 2).softmax(-1), (scores / 2).softmax(-1)
    assert got.item() == pytest.approx((p * (p / q).log()).sum().item(), rel=1e-6)
    assert ranking_loss(teacher, torch.zeros(3), [3], "distillation", teacher=teacher).item() == pytest.approx(
        0, abs=1e-7
    )


@pytest.mark.parametrize("kind", RANKING_LOSSES)
def test_micro_batches_of_whole_groups_add_up_to_the_batch(kind):
    """Gradient accumulation (or processes) over groups of different sizes: each micro-batch divides by the number
    of groups in the whole batch, so the losses and gradients add up to the one big batch's."""
    base, teacher = scores_and_teacher()
    whole = base.clone().requires_grad_()
    loss = ranking_loss(whole, RELEVANCE, SIZES, kind, temperature=0.7, teacher=teacher)
    loss.backward()
    split = base.clone().requires_grad_()
    total, start = 0.0, 0
    for sizes in ([3, 5], [2], [4]):  # whole groups per micro-batch, never a group split
        end = start + sum(sizes)
        part = ranking_loss(
            split[start:end], RELEVANCE[start:end], sizes, kind, 0.7, teacher[start:end], num_items_in_batch=len(SIZES)
        )
        part.backward()
        total += part.item()
        start = end
    assert total == pytest.approx(loss.item(), rel=1e-6)
    assert torch.allclose(split.grad, whole.grad, atol=1e-7)
    naive = (
        sum(
            ranking_loss(base[a : a + sum(s)], RELEVANCE[a : a + sum(s)], s, kind, 0.7, teacher[a : a + sum(s)]).item()
            for a, s in ((0, [3, 5]), (8, [2]), (10, [4]))
        )
        / 3
    )  # the mean of micro-batch means, which Trainer's averaging would give: not the batch's loss
    assert naive != pytest.approx(loss.item(), rel=1e-3)


def test_the_loss_is_fp32_for_low_precision_scores():
    scores, _ = scores_and_teacher()
    loss = ranking_loss(scores.bfloat16(), RELEVANCE, SIZES, "listwise")
    assert loss.dtype == torch.float32


def test_bad_groups_are_clear_errors():
    with pytest.raises(ValueError, match="a group without a positive"):
        ranking_loss(torch.zeros(3), torch.zeros(3), [3], "listwise")
    with pytest.raises(ValueError, match="3 scores, 3 relevances and groups of 4 documents must agree"):
        ranking_loss(torch.zeros(3), torch.ones(3), [4], "listwise")
    with pytest.raises(ValueError, match="kind 'lambda'"):
        ranking_loss(torch.zeros(3), torch.ones(3), [3], "lambda")
    with pytest.raises(ValueError, match="distillation needs teacher scores"):
        ranking_loss(torch.zeros(3), torch.ones(3), [3], "distillation")


@pytest.mark.parametrize("kind", RANKING_LOSSES)
def test_each_loss_is_an_object_holding_its_options_and_the_trainer_keeps_the_one_it_is_given(kind, tmp_path):
    """sentence-transformers' pattern: a loss object per file, built once with its options; `RankingTrainer` takes
    it as `loss=` (or its name, as before) and keeps that object for every step."""
    from architectures import BY_NAME, cpu_training_args, make_models

    from stable_models import RankingTrainer
    from stable_models.losses import RANKING_LOSS_CLASSES, GroupLoss

    scores, teacher = scores_and_teacher()
    loss_class = RANKING_LOSS_CLASSES[kind]
    loss = loss_class(0.5) if loss_class.takes_temperature else loss_class()
    assert isinstance(loss, GroupLoss) and loss.name == kind
    expected = ranking_loss(scores, RELEVANCE, SIZES, kind, 0.5 if loss.takes_temperature else 1.0, teacher)
    torch.testing.assert_close(loss.of_scores(scores, RELEVANCE, SIZES, teacher), expected, rtol=0, atol=0)
    model, _ = make_models(BY_NAME["qwen2"], num_labels=1)
    trainer = RankingTrainer(model=model, args=cpu_training_args(tmp_path), loss=loss)
    assert trainer.loss is loss
    named = RankingTrainer(model=model, args=cpu_training_args(tmp_path), loss=kind, temperature=0.5)
    assert type(named.loss) is loss_class
