"""FSDP2 run used by test_fsdp.py: `torchrun --nproc_per_node 2 fsdp_worker.py OUT`.

torch's `fully_shard` on gloo (transformers' Trainer runs FSDP only on GPUs), under a bf16 MixedPrecisionPolicy with
fp32 gradient reduction. Each rank trains on its half of every global batch; rank 0 writes, per scenario, the loss
curve (all-reduced mean), the logits dtype, the score shards' dtype and the low-precision warnings to OUT.
"""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(__file__))
from architectures import BY_NAME, make_models, pad_batch, random_sequences  # noqa: E402
from distributed import leave_process_group  # noqa: E402

LR, STEPS, BATCH = 0.01, 4, 8
BF16_POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
# what accelerate builds for FSDP2 from mixed_precision="bf16" (FullyShardedDataParallelPlugin.set_mixed_precision)
ACCELERATE_BF16_POLICY = MixedPrecisionPolicy(
    param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.bfloat16
)
POLICIES = {"bf16": BF16_POLICY, "accelerate-bf16": ACCELERATE_BF16_POLICY}


def global_batches():
    """STEPS left-padded batches of BATCH examples (lengths 3..12, 3 classes), the same in every process."""
    generator = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        lengths = torch.randint(3, 13, (BATCH,), generator=generator).tolist()
        ids, mask = pad_batch(random_sequences(lengths, seed=step), "left")
        yield ids, mask, torch.randint(0, 3, (BATCH,), generator=generator)


def run(arch_name: str, kind: str, stored_dtype: torch.dtype, policy: MixedPrecisionPolicy) -> dict:
    stable, stock = make_models(BY_NAME[arch_name])
    model = (stable if kind == "stable" else stock).to(stored_dtype).train()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    if stored_dtype != torch.float32:
        # one FSDP group needs one stored dtype: the fp32 head of a bf16-stored model is a group of its own
        fully_shard(model.score, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    rank, world = dist.get_rank(), dist.get_world_size()
    losses, logits_dtypes, loss_dtypes, messages = [], set(), set(), []
    for ids, mask, labels in global_batches():
        part = slice(rank * len(ids) // world, (rank + 1) * len(ids) // world)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(input_ids=ids[part], attention_mask=mask[part], labels=labels[part])
        messages += [str(w.message) for w in caught if "master weights" in str(w.message)]
        logits_dtypes.add(str(out.logits.dtype))
        loss_dtypes.add(str(out.loss.dtype))
        out.loss.backward()  # FSDP2 reduce-scatters the mean gradient over ranks
        optimizer.step()
        optimizer.zero_grad()
        loss = out.loss.detach().float()
        dist.all_reduce(loss)
        losses.append(loss.item() / world)
    return {
        "losses": losses,
        "logits_dtypes": sorted(logits_dtypes),
        "loss_dtypes": sorted(loss_dtypes),
        "score_shard_dtype": str(model.score.weight.dtype),
        "score_is_sharded": type(model.score.weight).__name__ == "DTensor",
        "warnings": messages,
    }


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    scenarios = [("stable", "float32", "bf16"), ("stock", "float32", "bf16"), ("stable", "bfloat16", "bf16")]
    scenarios.append(("stable", "float32", "accelerate-bf16"))
    results = {
        f"{arch}/{kind}/{dtype}/{policy}": run(arch, kind, getattr(torch, dtype), POLICIES[policy])
        for arch in ("qwen2", "gemma2")
        for kind, dtype, policy in scenarios
    }
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as handle:
            json.dump({"world": dist.get_world_size(), "results": results}, handle)
    leave_process_group()


if __name__ == "__main__":
    main()
