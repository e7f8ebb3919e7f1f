"""Evaluators as objects that hold their options (sentence-transformers' `evaluation/` pattern): one per kind of
model, each turning a model's scores into a report, shared by training's evaluation (`compute_metrics`, Trainer's
hook, fed the rows the task's Trainer predicts) and by `stable-models evaluate`; a Python user calls them on scores,
or on a model and its token ids (`of_model`), without the command line.

    evaluator = ClassificationEvaluator(["negative", "positive"])
    report = evaluator.of_model(model, tokenizer, [tokenizer(t)["input_ids"] for t in texts], labels)
"""

import torch

from .metrics import RANKING_CUTOFFS, classification_metrics, pairwise_metrics, ranking_metrics


def trainer_numbers(report: dict) -> dict:
    """The numbers of a report that Trainer logs (lists and tables stay in report.json)."""
    return {k: v for k, v in report.items() if isinstance(v, float)}


class ClassificationEvaluator:
    """Accuracy, F1, ROC-AUC, the confusion matrix and ECE (MSE and correlations for regression) of a classifier's
    logits against its targets (`labels.encode_labels`: ids, multi-hot rows, floats)."""

    def __init__(self, names, problem_type="single_label_classification", thresholds=None):
        self.names, self.problem_type, self.thresholds = list(names), problem_type, thresholds

    def __call__(self, logits, targets, thresholds=None) -> dict:
        used = self.thresholds if thresholds is None else thresholds
        return classification_metrics(torch.as_tensor(logits), targets, self.problem_type, self.names, used)

    def compute_metrics(self, prediction) -> dict:
        """Trainer's `compute_metrics`: an EvalPrediction's logits and labels."""
        return trainer_numbers(self(prediction.predictions, prediction.label_ids))

    def of_model(self, model, tokenizer, ids, targets, batch_size=16) -> dict:
        """The report of `model` on token-id lists (scored in batches of similar length, as `predict` scores)."""
        from .scoring import logits_in_length_order

        was_training = model.training
        model.eval()
        try:
            logits = logits_in_length_order(model, tokenizer, ids, batch_size)
        finally:
            model.train(was_training)
        return self(logits, targets)


class PairwiseEvaluator:
    """A reward model's pairwise accuracy, margins and calibration (per subset and RewardBench section where a
    `subset` name is given per pair)."""

    def __init__(self, subsets=None):
        self.subsets = subsets

    def __call__(self, chosen, rejected) -> dict:
        return pairwise_metrics(torch.as_tensor(chosen).double(), torch.as_tensor(rejected).double(), self.subsets)

    def compute_metrics(self, prediction) -> dict:
        """Trainer's `compute_metrics`: one row (r_chosen, r_rejected) per pair (PairwiseTrainer.prediction_step)."""
        rewards = torch.as_tensor(prediction.predictions).double()
        return trainer_numbers(self(rewards[:, 0], rewards[:, 1]))


class RankingEvaluator:
    """A reranker's NDCG, MRR, MAP and recall at `cutoffs` over query groups (trec_eval's definitions)."""

    def __init__(self, cutoffs=RANKING_CUTOFFS):
        self.cutoffs = cutoffs

    def __call__(self, scores, relevance, group_sizes) -> dict:
        return ranking_metrics(scores, relevance, group_sizes, self.cutoffs)

    def compute_metrics(self, prediction) -> dict:
        """Trainer's `compute_metrics`: one row per group (RankingTrainer.prediction_step), padded with NaN / -100."""
        logits = torch.as_tensor(prediction.predictions).double()
        labels = torch.as_tensor(prediction.label_ids).double()
        valid = labels >= 0
        return trainer_numbers(self(logits[valid], labels[valid], valid.sum(-1).tolist()))
