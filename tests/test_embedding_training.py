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


def test_micro_batches_under_activation_checkpointing_train_as_one_batch(one_batch, tmp_path):
    """Activation checkpointing on one process: each of the 4 micro-batches keeps its cache forward's graph (the
    layers' inputs) and the backward recomputes the rest: the same run."""
    same(run(tmp_path, "checkpointed", 1, 4, "--accumulate", "4", "--packed", "--checkpointing"), one_batch)


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


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_one_process_forwards_a_kept_micro_batch_once(tmp_path, checkpointing):
    """On one process the step's first micro-batch keeps its cache forward's graph: 2 micro-batches cost 3 forwards
    (cache 2, replay 1), not 4. Under activation checkpointing the first 8 keep it (such a graph is the layers'
    inputs): 10 micro-batches cost 12 forwards, where the replay made 20, and memory stays flat beyond the 8. The
    runs above show the kept graphs give the replayed run (DDP replays every one)."""
    import torch
    import transformers
    from architectures import BY_NAME, cpu_training_args, make_config
    from embedding_worker import Pad, SequentialTrainer, rows

    from stable_models.cli.fine_tuning import checkpointing_arguments
    from stable_models.embedding_training import EmbeddingCollator
    from stable_models.registry import embedding_class_for

    torch.manual_seed(0)
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"]))
    forwards = []
    model.register_forward_hook(lambda module, args, output: forwards.append(torch.is_grad_enabled()))
    layer_forwards, mlp = [], model.model.layers[0].mlp
    mlp_forward = mlp.forward  # the recomputation calls it (torch runs no module hooks there)
    mlp.forward = lambda *args, **kwargs: layer_forwards.append(torch.is_grad_enabled()) or mlp_forward(*args, **kwargs)
    accumulation = 10 if checkpointing else 2
    checkpoints = checkpointing_arguments(transformers.TrainingArguments, checkpointing, {"use_reentrant": False})
    training = cpu_training_args(
        str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=accumulation, max_steps=1,
        optim="sgd", **checkpoints,
    )  # fmt: skip
    SequentialTrainer(
        model=model, args=training, train_dataset=rows(48), data_collator=EmbeddingCollator(Pad())
    ).train()
    if checkpointing:
        assert forwards == [True] * 8 + [False] * 2 + [True] * 2  # 8 with their graphs kept; 2 without, replayed
        assert layer_forwards == [True] * 8 + [False] * 2 + [True] * (8 + 2 * 2)  # and recomputed in each backward
    else:
        assert forwards == [True, False, True]  # the first with its graph kept, the second without, then replayed
        assert layer_forwards == forwards
