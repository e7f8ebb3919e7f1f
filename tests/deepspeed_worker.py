"""DeepSpeed ZeRO-3 on CPU, used by test_deepspeed.py:
`DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 deepspeed_worker.py OUT FOLDER {fp32,bf16}`.

FOLDER holds `lm/` (a generative checkpoint: loading it as a classifier initialises a new `score`) and `classifier/`
(a saved Stable classifier). The classes are built under ZeRO-3 (`HfDeepSpeedConfig` alive before `from_pretrained`,
as `Trainer` does), so every parameter is partitioned at construction. Rank 0 writes per class: whether `score` is
partitioned, the std of the gathered new `score`, the logits/loss dtypes and first loss of a training step, and the
low-precision warnings.
"""

import json
import os
import sys
import warnings

import deepspeed
import torch
from transformers.integrations import HfDeepSpeedConfig

sys.path.insert(0, os.path.dirname(__file__))
from architectures import BY_NAME  # noqa: E402
from distributed import leave_process_group  # noqa: E402

IDS = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 11, 12, 13], [14, 15, 16, 17, 18, 19], [0, 20, 21, 22, 23, 24]])
MASK = (IDS != 0).long()
LABELS = torch.tensor([0, 1, 2, 1])


def ds_config(precision: str) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision == "bf16"},
    }


def run(cls, folder: str, config: dict) -> dict:
    model = cls.from_pretrained(folder, num_labels=3)
    weight = model.score.weight
    result = {"partitioned": hasattr(weight, "ds_id") and weight.numel() == 0}
    with deepspeed.zero.GatheredParameters([weight]):
        result["score_std"] = weight.float().std().item()
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    engine.train()
    rank = torch.distributed.get_rank()
    part = slice(2 * rank, 2 * rank + 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = engine(input_ids=IDS[part], attention_mask=MASK[part], labels=LABELS[part])
    engine.backward(out.loss)
    engine.step()
    loss = out.loss.detach().float()
    torch.distributed.all_reduce(loss)
    result.update(
        logits_dtype=str(out.logits.dtype),
        loss_dtype=str(out.loss.dtype),
        loss=loss.item() / torch.distributed.get_world_size(),
        warnings=[str(w.message) for w in caught if "master weights" in str(w.message)],
    )
    return result


def main():
    out, folder, precision = sys.argv[1:4]
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    config = ds_config(precision)
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841  (from_pretrained builds under zero.Init while it lives)
    arch = BY_NAME["qwen2"]
    results = {}
    for name, cls in (("stable", arch.stable_class), ("stock", arch.stock_class)):
        results[f"{name}/lm"] = run(cls, os.path.join(folder, "lm"), config)
        results[f"{name}/classifier"] = run(cls, os.path.join(folder, "classifier"), config)
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    leave_process_group()


if __name__ == "__main__":
    main()
