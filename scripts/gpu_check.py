"""`./dev gpu [--device cuda|cpu]`: the padding contract on the kernels of one machine, as one table.

For each architecture x kernel (eager, sdpa, flex, flash where installed) x dtype (fp32, bf16) x padding side, with
sliding windows (3) shorter than the padding (up to 5): the Stable class's padding error (padded batch vs each text
alone) against its bound (fp32: 1e-5; bf16: how far bf16 itself moves the unpadded logits from fp32), a finite
forward and backward, and the stock class on the same weights (its padding error, NaN logits). Exit status 1 when a
Stable row fails. Made for a CUDA machine (under 5 minutes on one GPU); `--device cpu` runs the same script in CI.
"""

import argparse
import importlib.util
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from architectures import BY_NAME, logits_alone, make_models, pad_batch, random_sequences  # noqa: E402

ARCHS = ("qwen2", "gemma2", "mistral")  # full attention; softcapping + alternating sliding windows; all sliding
LENGTHS = [9, 4, 6]  # padding of up to 5 tokens, longer than the sliding window (3)
FP32_BOUND = 1e-5


def kernels(arch, device):
    names = list(arch.attn_implementations) + ["flex_attention"]
    if device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        names.append("flash_attention_2")
    return names


def dtypes_for(attn):
    return ("bfloat16",) if attn == "flash_attention_2" else ("float32", "bfloat16")  # flash has no fp32 kernel


def check(arch, attn, dtype_name, side, device):
    dtype = getattr(torch, dtype_name)
    stable, stock = (m.to(device) for m in make_models(arch, attn, dtype=dtype))
    sequences = [s.to(device) for s in random_sequences(LENGTHS)]
    ids, mask = (t.to(device) for t in pad_batch([s.cpu() for s in sequences], side))
    alone = logits_alone(stable, sequences)
    if dtype == torch.float32:
        bound = FP32_BOUND
    else:
        reference = make_models(arch, "eager" if attn == "flash_attention_2" else attn)[0].to(device)
        bound = (alone.float() - logits_alone(reference, sequences)).abs().max().item()
    with torch.no_grad():
        error = (stable(ids, attention_mask=mask).logits - alone).abs().max().item()
        stock_logits = stock(ids, attention_mask=mask).logits
    stock_nan = bool(stock_logits.isnan().any())
    stock_error = (stock_logits.float() - logits_alone(stock, sequences).float()).abs().max().item()
    backward = "n/a"
    if not (attn == "flex_attention" and device == "cpu"):  # flex attention has no backward on CPU
        stable.train()
        loss = stable(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2], device=device)).loss
        loss.backward()
        grads = [p.grad for p in stable.parameters() if p.grad is not None]
        backward = "ok" if loss.isfinite() and all(g.isfinite().all() for g in grads) else "NaN"
    ok = error <= bound and backward != "NaN" and torch.isfinite(alone).all().item()
    return dict(error=error, bound=bound, backward=backward, stock_error=stock_error, stock_nan=stock_nan, ok=ok)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--archs", nargs="+", default=ARCHS, choices=ARCHS, help="rows to run (default: all)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("./dev gpu: no CUDA device here; run `./dev gpu --device cpu` for the same checks on CPU")
    # bf16-stored weights train here on purpose (the low-precision warning is for users), and flex attention runs
    # uncompiled on CPU and recompiles per shape: keep the table readable
    warnings.filterwarnings("ignore", message=".*(without fp32 master weights|flex_attention called without)")
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: TF32 matmuls round to 10 mantissa bits
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    import transformers

    print(f"# ./dev gpu: {name}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(
        "| arch | kernel | dtype | padding | Stable padding error | bound | Stable backward | stock padding error "
        "| stock NaN | Stable ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    start, failures = time.perf_counter(), 0
    for arch_name in args.archs:
        arch = BY_NAME[arch_name]
        for attn in kernels(arch, args.device):
            for dtype_name in dtypes_for(attn):
                for side in ("left", "right"):
                    row = check(arch, attn, dtype_name, side, args.device)
                    failures += not row["ok"]
                    print(
                        f"| {arch_name} | {attn} | {dtype_name} | {side} | {row['error']:.1e} | {row['bound']:.1e} "
                        f"| {row['backward']} | {row['stock_error']:.1e} | {'yes' if row['stock_nan'] else 'no'} "
                        f"| {'yes' if row['ok'] else 'NO'} |",
                        flush=True,
                    )
    print(f"\n{failures} failing Stable rows, {time.perf_counter() - start:.0f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
