"""Contrastive training of an embedding model is exact over the global batch (issue 58): one batch of 16, 4
micro-batches of 4 with gradient accumulation, and two processes of 8 (torchrun, gloo) log the same losses and grad
norms (relative 1e-4) and end with the same weights (1e-6), a repeated positive masked in each. So do two processes
under DeepSpeed ZeRO-3 (exhaustive tier). What the cache replaces, each micro-batch's queries against its own
candidates, trains another model."""

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


def test_packed_micro_batches_train_as_the_padded_batch(one_batch, tmp_path):
    """Every text of a micro-batch laid end to end in rows without padding: the same vectors, so the same run."""
    same(run(tmp_path, "packed", 1, 4, "--accumulate", "4", "--packed"), one_batch)


def test_two_processes_train_as_one_batch(one_batch, tmp_path):
    two = run(tmp_path, "two", 2, 8)
    assert two["world"] == 2
    same(two, one_batch)
    assert two["false_negatives"] == [2, 2, 2, 2]  # the pair sits on different processes: found by the gathered hashes


def test_the_negatives_of_the_micro_batch_alone_train_another_model(one_batch, tmp_path):
    alone = run(tmp_path, "alone", 1, 4, "--accumulate", "4", "--micro-batch-negatives")
    assert alone["losses"][0] < 0.7 * one_batch["losses"][0]  # 7 candidates a query, not 31
    assert alone["weights"] != pytest.approx(one_batch["weights"], rel=1e-6)


@pytest.mark.exhaustive
def test_two_processes_under_zero3_train_as_one_batch(one_batch, tmp_path):
    """DeepSpeed ZeRO-3 (each parameter in slices): the cached loss is ordinary gradient accumulation to it, so the
    run is the one batch's (the cache's no-graph forward and the replayed forward both gather the slices)."""
    pytest.importorskip("deepspeed")
    zero3 = run(tmp_path, "zero3", 2, 8, "--zero3")
    assert zero3["world"] == 2 and zero3["zero_stage"] == 3 and one_batch["zero_stage"] == 0
    same(zero3, one_batch)
    assert zero3["false_negatives"] == [2, 2, 2, 2]


@pytest.mark.exhaustive
def test_two_processes_under_fsdp2_train_as_one_batch(one_batch, tmp_path):
    """FSDP2 (torch's `fully_shard`; Trainer runs FSDP only on GPUs, so the worker runs Trainer's step by hand on
    gloo): every parameter sharded, the cache's no-graph forward and the replayed one each gather it, and the
    reduce-scatter averages the scaled gradients: the one batch's run."""
    fsdp = run(tmp_path, "fsdp", 2, 8, "--fsdp")
    assert fsdp["world"] == 2 and fsdp["sharded"]
    same(fsdp, one_batch)
    assert fsdp["false_negatives"] == [2, 2, 2, 2]


def test_one_process_forwards_the_first_micro_batch_once(tmp_path):
    """On one process the step's first micro-batch keeps its cache forward's graph: 2 micro-batches cost 3 forwards
    (cache 2, replay 1), not 4. The runs above show the kept graph gives the replayed run (DDP replays every one)."""
    import torch
    from architectures import BY_NAME, cpu_training_args, make_config
    from embedding_worker import Pad, SequentialTrainer, rows

    from stable_models.embedding_training import EmbeddingCollator
    from stable_models.registry import embedding_class_for

    torch.manual_seed(0)
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"]))
    forwards = []
    model.register_forward_hook(lambda module, args, output: forwards.append(torch.is_grad_enabled()))
    training = cpu_training_args(
        str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1, optim="sgd"
    )
    SequentialTrainer(
        model=model, args=training, train_dataset=rows(16), data_collator=EmbeddingCollator(Pad())
    ).train()
    assert forwards == [True, False, True]  # the first with its graph kept, the second without, then replayed
