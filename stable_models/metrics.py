"""The numbers an evaluation reports, from logits or rewards already computed: classification scores, a confusion
matrix and the expected calibration error (ECE); regression errors and correlations; pairwise accuracy, margins and
RewardBench's section scores for reward models.
"""

import torch


def probabilities(logits, problem_type):
    if problem_type == "single_label_classification":
        return logits.softmax(-1)
    if problem_type == "multi_label_classification":
        return logits.sigmoid()
    return logits


def expected_calibration_error(confidence, correct, bins=15) -> float:
    """Mean |accuracy - confidence| over equal-width confidence bins, weighted by their share of the predictions."""
    confidence, correct = torch.as_tensor(confidence).flatten().double(), torch.as_tensor(correct).flatten().double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    total = 0.0
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = (confidence > low) & (confidence <= high) if low > 0 else (confidence >= low) & (confidence <= high)
        if inside.any():
            total += inside.double().mean().item() * abs(correct[inside].mean() - confidence[inside].mean()).item()
    return total


def calibration_points(logits, targets, problem_type):
    """(confidence, correct) pairs that ECE and the reliability diagram read."""
    probs = probabilities(logits, problem_type)
    if problem_type == "single_label_classification":
        confidence, predicted = probs.max(-1)
        return confidence, (predicted == torch.as_tensor(targets)).double()
    return probs.flatten(), torch.as_tensor(targets, dtype=torch.float64).flatten()


def classification_metrics(logits, targets, problem_type, names, thresholds=None) -> dict:
    """The report: classification scores, a confusion matrix and ECE, or regression errors and correlations."""
    import numpy
    from sklearn import metrics as sk

    logits = torch.as_tensor(logits, dtype=torch.float32)
    if problem_type == "regression":
        from scipy import stats

        predicted, truth = logits.squeeze(-1).numpy(), numpy.asarray(targets, dtype=numpy.float64)
        constant = numpy.ptp(predicted) == 0 or numpy.ptp(truth) == 0
        return {
            "examples": len(truth),
            "mse": float(sk.mean_squared_error(truth, predicted)),
            "mae": float(sk.mean_absolute_error(truth, predicted)),
            "pearson": None if constant else float(stats.pearsonr(truth, predicted)[0]),
            "spearman": None if constant else float(stats.spearmanr(truth, predicted)[0]),
        }
    probs = probabilities(logits, problem_type).numpy()
    truth = numpy.asarray(targets)
    if problem_type == "single_label_classification":
        predicted = probs.argmax(-1)
        labels = list(range(len(names)))
    else:
        cut = numpy.asarray(thresholds if thresholds is not None else [0.5] * len(names))
        predicted = (probs >= cut).astype(int)
        truth = truth.astype(int)
        labels = None
    precision, recall, f1, support = sk.precision_recall_fscore_support(
        truth, predicted, labels=labels, zero_division=0
    )
    report = {
        "examples": len(truth),
        "accuracy": float(sk.accuracy_score(truth, predicted)),
        "f1_macro": float(sk.f1_score(truth, predicted, average="macro", labels=labels, zero_division=0)),
        "f1_micro": float(sk.f1_score(truth, predicted, average="micro", labels=labels, zero_division=0)),
        "per_class": {
            name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(names, precision, recall, f1, support, strict=True)
        },
        "ece": expected_calibration_error(*calibration_points(logits, targets, problem_type)),
    }
    if problem_type == "single_label_classification":
        report["confusion_matrix"] = sk.confusion_matrix(truth, predicted, labels=labels).tolist()
        if len(names) == 2 and len(set(truth.tolist())) == 2:
            report["roc_auc"] = float(sk.roc_auc_score(truth, probs[:, 1]))
    else:
        present = [c for c in range(len(names)) if 0 < truth[:, c].sum() < len(truth)]
        if present:
            report["roc_auc"] = float(sk.roc_auc_score(truth[:, present], probs[:, present], average="macro"))
        report["confusion_matrix"] = sk.multilabel_confusion_matrix(truth, predicted).tolist()
    return report


# RewardBench (v1): its subsets, weighted by their example counts within a section (math-prm counted as 984, as
# RewardBench upweights it to equal the code subsets); the score is the mean of the sections
REWARDBENCH_SECTIONS = {
    "Chat": {
        "alpacaeval-easy": 100,
        "alpacaeval-length": 95,
        "alpacaeval-hard": 95,
        "mt-bench-easy": 28,
        "mt-bench-med": 40,
    },
    "Chat Hard": {
        "mt-bench-hard": 37,
        "llmbar-natural": 100,
        "llmbar-adver-neighbor": 134,
        "llmbar-adver-GPTInst": 92,
        "llmbar-adver-GPTOut": 47,
        "llmbar-adver-manual": 46,
    },
    "Safety": {
        "refusals-dangerous": 100,
        "refusals-offensive": 100,
        "xstest-should-refuse": 154,
        "xstest-should-respond": 250,
        "donotanswer": 136,
    },
    "Reasoning": {
        "math-prm": 984,
        "hep-cpp": 164,
        "hep-go": 164,
        "hep-java": 164,
        "hep-js": 164,
        "hep-python": 164,
        "hep-rust": 164,
    },
}


def pair_logits(chosen, rejected) -> torch.Tensor:
    """A pair as a two-class problem, class 1 = chosen preferred: softmax gives sigmoid(r_chosen - r_rejected), and
    the classification ECE, temperature fit and reliability diagram apply as they are."""
    return torch.stack([torch.as_tensor(rejected), torch.as_tensor(chosen)], -1).double()


def pairwise_metrics(chosen, rejected, subsets=None) -> dict:
    """Pairwise accuracy (a tie counts as wrong, as in TRL and RewardBench), the reward margin's mean and spread, the
    ECE of sigmoid(r_chosen - r_rejected); with `subsets`, accuracy per subset and RewardBench's section scores
    where the subset names match."""
    chosen, rejected = torch.as_tensor(chosen).double(), torch.as_tensor(rejected).double()
    margin = chosen - rejected
    logits = pair_logits(chosen, rejected)
    report = {
        "pairs": len(margin),
        "accuracy": (margin > 0).double().mean().item(),
        "margin_mean": margin.mean().item(),
        "margin_std": margin.std().item() if len(margin) > 1 else 0.0,
        "ece": expected_calibration_error(
            *calibration_points(logits, torch.ones(len(margin)), "single_label_classification")
        ),
        "reward_chosen_mean": chosen.mean().item(),
        "reward_rejected_mean": rejected.mean().item(),
        "ties": int((margin == 0).sum()),
    }
    if subsets is not None:
        correct: dict = {}
        for name, right in zip(subsets, (margin > 0).tolist(), strict=True):
            correct.setdefault(str(name), []).append(right)
        report["per_subset"] = {n: {"accuracy": sum(c) / len(c), "pairs": len(c)} for n, c in sorted(correct.items())}
        sections = {}
        for section, counts in REWARDBENCH_SECTIONS.items():
            present = [s for s in counts if s in report["per_subset"]]
            if present:
                weight = sum(counts[s] for s in present)
                sections[section] = sum(report["per_subset"][s]["accuracy"] * counts[s] for s in present) / weight
        if sections:
            report["rewardbench_sections"] = sections
            report["rewardbench_score"] = sum(sections.values()) / len(sections)
    return report


RANKING_CUTOFFS = (1, 5, 10)


def ranking_metrics(scores, relevance, group_sizes, cutoffs=RANKING_CUTOFFS) -> dict:
    """Ranking quality over query groups laid end to end (trec_eval's definitions, as ir-measures / pytrec_eval give
    them, tested against ir-measures): NDCG@k with linear gain, MRR@10, MAP and Recall@k, each the mean over queries;
    documents are ranked by score, ties in input order. `per_query_ndcg@10` keeps each query's NDCG@10 (for the
    histogram). A query without a relevant document counts 0 everywhere (the checks refuse such groups)."""
    scores = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    relevance = torch.as_tensor(relevance, dtype=torch.float64).reshape(-1)
    sizes = [int(n) for n in group_sizes]
    per_query: dict[str, list[float]] = {}
    for group_scores, gains in zip(scores.split(sizes), relevance.split(sizes), strict=True):
        order = torch.sort(group_scores, descending=True, stable=True).indices
        ranked, ideal = gains[order], gains.sort(descending=True).values
        relevant = ranked > 0
        found = relevant.cumsum(0)
        positions = torch.arange(1, len(ranked) + 1, dtype=torch.float64)
        discount = 1 / torch.log2(positions + 1)
        total = int(relevant.sum())
        values = {}
        for k in cutoffs:
            best = (ideal[:k] * discount[:k]).sum()
            values[f"ndcg@{k}"] = float((ranked[:k] * discount[:k]).sum() / best) if best > 0 else 0.0
            values[f"recall@{k}"] = float(found[: min(k, len(found))][-1] / total) if total else 0.0
        first = int(relevant.nonzero()[0]) + 1 if total else None
        values["mrr@10"] = 1 / first if first is not None and first <= 10 else 0.0
        values["map"] = float((found / positions)[relevant].sum() / total) if total else 0.0
        for key, value in values.items():
            per_query.setdefault(key, []).append(value)
    report = {key: sum(values) / len(values) for key, values in per_query.items()}
    report["queries"] = len(sizes)
    report["per_query_ndcg@10"] = per_query.get("ndcg@10", [])
    return report
