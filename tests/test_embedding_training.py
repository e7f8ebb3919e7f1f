"""Contrastive training of an embedding model is exact over the global batch (issue 58): one batch of 16, 4
micro-batches of 4 with gradient accumulation, and two processes of 8 (torchrun, gloo) log the same losses and grad
norms (relative 1e-4) and end with the same weights (1e-6), a repeated positive masked in each. What the cache
replaces, each micro-batch's queries against its own candidates, trains another model."""

from pathlib import Path

import pytest
from distributed import run_worker

WORKER = Path(__file__).with_name("embedding_worker.py")


def run(tmp_path, name, processes, batch, *extra):
    return run_worker(WORKER, tmp_path / f"{name}.json", "--batch", str(batch), *extra, processes=processes)


@pytest.fixture(scope="module")
def one_batch(tmp_path_factory):
    return run(tmp_path_factory.mktemp("one"), "one", 1, 16)


def same(got, expected):
    assert len(got["losses"]) == len(expected["losses"]) == 4
    assert got["losses"] == pytest.approx(expected["losses"], rel=1e-4)
    assert got["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-4)
    assert got["weights"] == pytest.approx(expected["weights"], rel=1e-6)


def test_micro_batches_with_accumulation_train_as_one_batch(one_batch, tmp_path):
    same(run(tmp_path, "accumulated", 1, 4, "--accumulate", "4"), one_batch)
    assert one_batch["false_negatives"] == [2, 2, 2, 2]  # the repeated positive, masked from both its queries


def test_two_processes_train_as_one_batch(one_batch, tmp_path):
    two = run(tmp_path, "two", 2, 8)
    assert two["world"] == 2
    same(two, one_batch)
    assert two["false_negatives"] == [2, 2, 2, 2]  # the pair sits on different processes: found by the gathered hashes


def test_the_negatives_of_the_micro_batch_alone_train_another_model(one_batch, tmp_path):
    alone = run(tmp_path, "alone", 1, 4, "--accumulate", "4", "--micro-batch-negatives")
    assert alone["losses"][0] < 0.7 * one_batch["losses"][0]  # 7 candidates a query, not 31
    assert alone["weights"] != pytest.approx(one_batch["weights"], rel=1e-6)
