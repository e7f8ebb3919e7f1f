"""stable_models.metrics.ranking_metrics: NDCG@k, MRR@10, MAP and Recall@k over query groups equal ir-measures'
(trec_eval's definitions) on random groups of graded relevance, and a small case by hand."""

import math
import random

import pytest

from stable_models.metrics import ranking_metrics


def test_a_small_case_by_hand():
    # one query, ranked by score: relevances 0, 2, 0, 1 -> the first relevant document is second
    report = ranking_metrics([0.9, 0.8, 0.1, 0.05], [0, 2, 0, 1], [4])
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    assert report["ndcg@10"] == pytest.approx(dcg / ideal)
    assert report["ndcg@1"] == 0.0 and report["recall@1"] == 0.0 and report["recall@5"] == 1.0
    assert report["mrr@10"] == 0.5
    assert report["map"] == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert report["queries"] == 1 and report["per_query_ndcg@10"] == [pytest.approx(dcg / ideal)]


def test_equals_ir_measures_on_random_groups():
    import ir_measures  # a test dependency (pyproject's test extra)

    rng = random.Random(0)
    sizes, scores, relevance, qrels, run = [], [], [], [], []
    for query in range(60):
        size = rng.randint(1, 25)
        gains = [rng.choice([0, 0, 0, 1, 2, 3]) for _ in range(size)]
        gains[rng.randrange(size)] = rng.randint(1, 3)  # every group has a positive
        values = rng.sample(range(10_000), size)  # distinct scores: trec_eval breaks ties by document id
        sizes.append(size)
        for doc, (gain, value) in enumerate(zip(gains, values, strict=True)):
            scores.append(value / 100)
            relevance.append(gain)
            qrels.append(ir_measures.Qrel(str(query), f"d{doc}", gain))
            run.append(ir_measures.ScoredDoc(str(query), f"d{doc}", value / 100))
    ours = ranking_metrics(scores, relevance, sizes)
    names = {
        "ndcg@1": ir_measures.nDCG @ 1,
        "ndcg@5": ir_measures.nDCG @ 5,
        "ndcg@10": ir_measures.nDCG @ 10,
        "mrr@10": ir_measures.RR @ 10,
        "map": ir_measures.AP,
        "recall@1": ir_measures.R @ 1,
        "recall@5": ir_measures.R @ 5,
        "recall@10": ir_measures.R @ 10,
    }
    theirs = ir_measures.calc_aggregate(list(names.values()), qrels, run)
    for key, measure in names.items():
        assert ours[key] == pytest.approx(theirs[measure], abs=1e-6), key
