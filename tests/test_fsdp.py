"""FSDP2 (`fully_shard`, 2 gloo processes) under a bf16 MixedPrecisionPolicy: fp32 logits and loss, fp32 score shards,
no false low-precision warning (a bf16-stored model still gets it), and the loss curve of one process with the whole
batch within bf16 noise."""

from pathlib import Path

import fsdp_worker
import pytest
import torch
from architectures import BY_NAME, make_models
from distributed import run_worker

WORKER = Path(fsdp_worker.__file__)


def launch(out: Path, processes: int) -> dict:
    results = run_worker(WORKER, out, processes=processes, torchrun=True)  # the worker needs a process group
    assert results["world"] == processes
    return results["results"]


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory):
    """The worker's scenarios with 2 processes (half the batch each) and with 1 (the whole batch, same policy)."""
    folder = tmp_path_factory.mktemp("fsdp")
    return {processes: launch(folder / f"{processes}.json", processes) for processes in (2, 1)}


def one_process_fp32_curve(arch_name: str) -> list[float]:
    """The same SGD run in one process on the whole batch, fp32, no FSDP."""
    model = make_models(BY_NAME[arch_name])[0].train()
    optimizer = torch.optim.SGD(model.parameters(), lr=fsdp_worker.LR)
    losses = []
    for ids, mask, labels in fsdp_worker.global_batches():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("arch_name", ["qwen2", "gemma2"])
def test_fsdp2_bf16_policy_keeps_the_head_fp32_and_the_loss_curve(fsdp_results, arch_name):
    stable = fsdp_results[2][f"{arch_name}/stable/float32/bf16"]
    stock = fsdp_results[2][f"{arch_name}/stock/float32/bf16"]
    assert stable["score_is_sharded"] and stable["score_shard_dtype"] == "torch.float32"
    assert stable["logits_dtypes"] == ["torch.float32"]
    assert stock["logits_dtypes"] == ["torch.bfloat16"]  # the stock head runs in the policy's bf16
    # FSDP2 keeps fp32 shards (the optimizer's master weights): no "without fp32 master weights" warning
    assert stable["warnings"] == []

    # bf16 noise = how far the bf16 policy itself moves one process's curve from the fp32 run
    fp32 = one_process_fp32_curve(arch_name)
    whole_batch = fsdp_results[1][f"{arch_name}/stable/float32/bf16"]["losses"]
    noise = max_gap(whole_batch, fp32)
    assert 0 < noise < 0.1
    # two processes with half the batch each: as close to the fp32 curve as bf16 allows, so within twice that noise
    # of the one-process bf16 curve (both sit within the noise of the fp32 one); a doubled loss or a summed instead
    # of averaged gradient lands far outside
    assert max_gap(stable["losses"], fp32) <= 2 * noise, (stable["losses"], whole_batch, fp32)
    assert max_gap(stable["losses"], whole_batch) <= 2 * noise


@pytest.mark.parametrize("arch_name", ["qwen2", "gemma2"])
def test_fsdp2_still_warns_when_the_shards_themselves_are_bf16(fsdp_results, arch_name):
    bf16_stored = fsdp_results[2][f"{arch_name}/stable/bfloat16/bf16"]
    assert len(bf16_stored["warnings"]) == 1 and "torch.bfloat16" in bf16_stored["warnings"][0]
    assert bf16_stored["score_shard_dtype"] == "torch.float32"  # the head itself stays fp32 even then


@pytest.mark.parametrize("arch_name", ["qwen2", "gemma2"])
def test_accelerates_default_bf16_policy_casts_the_outputs_to_bf16(fsdp_results, arch_name):
    """accelerate's FSDP2 policy for mixed_precision="bf16" has output_dtype=bf16: FSDP2 casts the returned logits
    and loss to bf16 after the fp32 head computed them (the README says which policy to pass instead)."""
    default = fsdp_results[2][f"{arch_name}/stable/float32/accelerate-bf16"]
    assert default["logits_dtypes"] == ["torch.bfloat16"] and default["loss_dtypes"] == ["torch.bfloat16"]
    ours = fsdp_results[2][f"{arch_name}/stable/float32/bf16"]
    assert ours["logits_dtypes"] == ["torch.float32"] and ours["loss_dtypes"] == ["torch.float32"]
