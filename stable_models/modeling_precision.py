"""Trainable weights without fp32 master copies: found through FSDP2 shards and DeepSpeed's mixed-precision mode,
so the first training step can warn (an AdamW update below half a bf16 step vanishes). Also the ZeRO-3 init of a
new `score` head.

In the core copied next to a checkpoint because the Stable forward and from_pretrained call it; it imports neither
FSDP nor DeepSpeed itself (it reads the state they left).
"""

import sys

import torch


def fsdp2_sharded_parameters(model) -> dict[tuple[int, str], torch.Tensor]:
    """(id(module), name) -> the parameter FSDP2 (`fully_shard`) stores for it. During forward FSDP2 swaps each of
    its parameters for an unsharded copy in the mixed-precision policy's param_dtype; the sharded parameter is what
    the optimizer updates, i.e. the master weight. Read through FSDP2's internals; empty when they change."""
    sharded = {}
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if callable(state) else None
        for fsdp_param in getattr(group, "fsdp_params", ()):
            info, param = getattr(fsdp_param, "_module_info", None), getattr(fsdp_param, "sharded_param", None)
            if info is not None and param is not None:
                sharded[(id(info.module), info.param_name)] = param
    return sharded


def initialize_gathered(model, module) -> None:
    """Initialise a new module of a ZeRO-3 model with its parameters gathered: transformers 4.57 initialises a
    missing `score` while it is partitioned, leaving zeros or uninitialised memory (transformers#43847). Only
    called with ZeRO-3 enabled, i.e. with deepspeed already imported by transformers (this file, copied as remote
    code, imports nothing beyond torch and transformers)."""
    deepspeed = sys.modules["deepspeed"]
    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
        if torch.distributed.get_rank() == 0:  # rank 0 writes; GatheredParameters scatters it to the others
            model._init_weights(module)


def deepspeed_mixed_precision() -> bool:
    """DeepSpeed in bf16/fp16 mode, set up through transformers (as Trainer does): its optimizer updates fp32 copies
    of the half-precision parameters, i.e. keeps fp32 master weights."""
    from transformers.integrations.deepspeed import deepspeed_config

    config = deepspeed_config() or {}
    return any(config.get(key, {}).get("enabled") in (True, "auto") for key in ("bf16", "fp16"))


def low_precision_trainables(model) -> list[tuple[str, torch.dtype]]:
    """Trainable parameters stored in bf16/fp16, i.e. trained without fp32 master weights (under FSDP2: judged by
    the shards, not by the policy's unsharded copies; under DeepSpeed's bf16/fp16 modes none, its optimizer keeps
    fp32 copies)."""
    half = (torch.bfloat16, torch.float16)
    if deepspeed_mixed_precision():
        return []
    sharded = fsdp2_sharded_parameters(model)
    found, seen = [], set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            stored = sharded.get((id(module), name), param)
            if id(stored) not in seen and stored.requires_grad and stored.dtype in half:
                seen.add(id(stored))
                found.append((f"{module_name}.{name}" if module_name else name, stored.dtype))
    return found


LOW_PRECISION_ADVICE = (
    "{count} trainable parameters (e.g. {example}) are stored in {dtype} without fp32 master weights: AdamW updates "
    "smaller than half a {dtype} step round away (measured: 3 steps at lr 1e-6 change 2 % of bf16 weights, 95 % of "
    "fp32 ones), so the loss can stay flat. Load with dtype=torch.float32 and train under bf16 autocast "
    "(TrainingArguments(bf16=True)), or train LoRA adapters (peft keeps them in fp32)."
)
