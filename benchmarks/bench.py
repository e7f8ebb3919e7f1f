"""Stable vs stock, measured in one run: ratios, not absolute numbers, are the result.

    ./dev bench                       # everything, CPU, ~10 minutes on 2 cores
    ./dev bench --only step           # forward and forward+backward time and peak memory
    ./dev bench --only throughput     # real tokens/s on length-skewed batches: padding vs packing
    ./dev bench --only packing        # batch 8..128: padding, length-grouped, one packed row, capped rows
    ./dev bench --only compile        # torch.compile vs eager

Each timing is the median of --repeats runs after --warmup runs, stock and Stable alternating in one process. Memory:
on CUDA the peak allocated above what was in use before the step; on CPU (no allocator statistics) the bytes of the
distinct tensors autograd saves for backward, i.e. the activation memory of a training step.
"""

import argparse
import functools
import math
import platform
import statistics
import time
import warnings

import torch
import transformers

import stable_models

MID = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    num_labels=3,
    pad_token_id=0,
)
ARCHS = {
    "gemma2": (
        transformers.Gemma2Config,
        dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=128),
        transformers.Gemma2ForSequenceClassification,
        stable_models.StableGemma2ForSequenceClassification,
        "eager",
    ),
    "qwen2": (
        transformers.Qwen2Config,
        dict(),
        transformers.Qwen2ForSequenceClassification,
        stable_models.StableQwen2ForSequenceClassification,
        "sdpa",
    ),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(arch, kind, dtype, device, seed=0, **overrides):
    config_class, extra, stock, stable, attn = ARCHS[arch]
    torch.manual_seed(seed)
    model_class = stable if kind == "stable" else stock
    model = model_class(config_class(**{**MID, **overrides}, **extra, attn_implementation=attn))
    return model.to(device=device, dtype=DTYPES[dtype])


def inputs(batch, length, padded, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, MID["vocab_size"], (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    if padded:  # left padding, from none to 3/4 of the row
        for row in range(batch):
            pad = row * (3 * length // 4) // max(1, batch - 1)
            ids[row, :pad], mask[row, :pad] = 0, 0
    labels = torch.randint(0, MID["num_labels"], (batch,), generator=generator)
    return ids.to(device), mask.to(device), labels.to(device)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_time(fn, warmup, repeats, device):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def saved_activation_bytes(fn):
    """Bytes of the distinct tensors autograd keeps for backward during fn(): the activation memory of training."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return sum(storages.values())


def peak_bytes(fn, device, training):
    """CUDA: peak allocated memory above the memory in use before fn(). CPU: saved activations (training only)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return saved_activation_bytes(fn) if training else float("nan")


def one_step(model, ids, mask, labels, mode):
    if mode == "forward":
        with torch.no_grad():
            model(ids, attention_mask=mask)
    else:
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)


def bench_step(args):
    """Stock and Stable alternate run by run in one process, so drift in the machine's speed cancels in the ratio."""
    memory = "peak MiB" if args.device.startswith("cuda") else "saved MiB"
    print(
        f"\n## step: batch {args.batch} x {args.length}, hidden 512, 4 layers (median of {args.repeats}, alternating)"
    )
    print(
        f"{'arch':7} {'dtype':5} {'padding':8} {'mode':8} {'stock ms':>9} {'Stable ms':>9} {'ratio':>6} "
        f"{'stock ' + memory:>15} {'Stable ' + memory:>16} {'ratio':>6}"
    )
    for arch in args.archs:
        for dtype in args.dtypes:
            for padded in (False, True):
                models = {kind: build(arch, kind, dtype, args.device) for kind in ("stock", "stable")}
                models["stable"].load_state_dict(models["stock"].state_dict())
                ids, mask, labels = inputs(args.batch, args.length, padded, args.device)
                for mode in ("forward", "train"):
                    steps = {}
                    for kind, model in models.items():
                        model.train(mode == "train")
                        steps[kind] = functools.partial(one_step, model, ids, mask, labels, mode)
                    for _ in range(args.warmup):
                        for step in steps.values():
                            step()
                    times = {kind: [] for kind in steps}
                    for _ in range(args.repeats):
                        for kind, step in steps.items():
                            sync(args.device)
                            start = time.perf_counter()
                            step()
                            sync(args.device)
                            times[kind].append(time.perf_counter() - start)
                    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
                    mib = {k: peak_bytes(step, args.device, mode == "train") / 2**20 for k, step in steps.items()}
                    print(
                        f"{arch:7} {dtype:5} {'left' if padded else 'none':8} {mode:8} {ms['stock']:9.1f} "
                        f"{ms['stable']:9.1f} {ms['stable'] / ms['stock']:6.3f} {mib['stock']:15.1f} "
                        f"{mib['stable']:16.1f} {mib['stable'] / mib['stock']:6.3f}",
                        flush=True,
                    )


def skewed_lengths(count, seed, low=8, high=512):
    generator = torch.Generator().manual_seed(seed)
    return [
        int(math.exp(math.log(low) + torch.rand((), generator=generator).item() * math.log(high / low)))
        for _ in range(count)
    ]


def train_pass(model, batches, packing, device, losses):
    """Forward+backward over every batch, padded on the right (the stock class pools that correctly) or packed."""
    losses.clear()
    for sequences, labels in batches:
        if packing:
            features = [{"input_ids": s, "labels": y} for s, y in zip(sequences, labels, strict=True)]
            batch = stable_models.PackedCollator(max_tokens=None)(features)
        else:
            width = max(len(s) for s in sequences)
            ids = torch.zeros(len(sequences), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, s in enumerate(sequences):
                ids[row, : len(s)], mask[row, : len(s)] = s, 1
            batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())


def bench_throughput(args):
    """Real (non-pad) tokens per second for forward+backward, on log-uniform lengths 8..512, batch 8."""
    print(f"\n## throughput: {args.throughput_batches} batches of 8, lengths log-uniform in [8, 512], fp32, train")
    generator = torch.Generator().manual_seed(1)
    batches = []
    for b in range(args.throughput_batches):
        lengths = skewed_lengths(8, seed=b)
        sequences = [torch.randint(1, MID["vocab_size"], (n,), generator=generator) for n in lengths]
        batches.append((sequences, torch.randint(0, 3, (8,), generator=generator)))
    real_tokens = sum(len(s) for seqs, _ in batches for s in seqs)
    print(f"{'arch':7} {'setup':22} {'tokens/s':>9} {'vs stock':>8} {'mean loss':>10}")
    for arch in args.archs:
        results = {}
        for setup in ("stock, padding", "Stable, padding", "Stable, packing"):
            model = build(arch, "stock" if setup.startswith("stock") else "stable", "fp32", args.device).train()
            losses = []
            run_all = functools.partial(train_pass, model, batches, setup.endswith("packing"), args.device, losses)
            seconds = median_time(run_all, 1, args.throughput_repeats, args.device)
            results[setup] = (real_tokens / seconds, sum(losses) / len(losses))
            base = results["stock, padding"][0]
            print(
                f"{arch:7} {setup:22} {results[setup][0]:9.0f} {results[setup][0] / base:7.2f}x "
                f"{results[setup][1]:10.6f}",
                flush=True,
            )


def padded_batch(sequences, labels):
    """Right padding (the stock class pools that correctly)."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(sequences):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def packing_batches(setup, examples, batch_size, max_tokens):
    """The batches one setup trains on, from the same examples: padded in the order given, length-grouped (what
    train_sampling_strategy="group_by_length" approximates: sorted by length, then cut into batches), one packed row
    per batch, or packed rows of at most max_tokens tokens."""
    order = list(range(len(examples)))
    if setup == "stock, length-grouped":
        order.sort(key=lambda i: len(examples[i][0]))
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start : start + batch_size]]
        sequences, labels = [s for s, _ in chunk], torch.stack([y for _, y in chunk])
        if setup.endswith("one row") or setup.endswith("capped rows"):
            cap = None if setup.endswith("one row") else max_tokens or "longest"
            features = [{"input_ids": s, "labels": y} for s, y in chunk]
            batches.append(stable_models.PackedCollator(max_tokens=cap)(features))
        else:
            batches.append(padded_batch(sequences, labels))
    return batches


PACKING_SETUPS = (
    "stock, padding",
    "Stable, padding",
    "Stable, one row",
    "Stable, capped rows",
    "stock, length-grouped",
)


def bench_packing(args):
    """Real tokens/s (forward+backward) at growing batch sizes, every setup on the same examples, setups alternating
    round by round in one process; ratios to the stock class with plain padding, the ideal (padded / real tokens)
    beside them, and the saved-activation memory of the largest step (measured in the warm-up round)."""
    print(
        f"\n## packing: lengths log-uniform in [8, 512], fp32, train, hidden {args.packing_hidden}, "
        f"{args.packing_layers} layers, {args.packing_rounds} alternating rounds after a warm-up round, "
        + (f"rows capped at {args.max_tokens} tokens" if args.max_tokens else "rows near the longest example (default)")
    )
    print(
        f"{'arch':7} {'batch':>5} {'setup':22} {'tokens/s':>9} {'vs stock':>8} {'ideal':>6} {'of ideal':>8} "
        f"{'saved MiB':>10} {'loss':>9}"
    )
    for arch in args.archs:
        size = dict(
            hidden_size=args.packing_hidden,
            intermediate_size=args.packing_hidden * 11 // 4,
            num_hidden_layers=args.packing_layers,
        )
        models = {kind: build(arch, kind, "fp32", args.device, **size).train() for kind in ("stock", "stable")}
        for batch_size in args.packing_batch_sizes:
            generator = torch.Generator().manual_seed(batch_size)
            count = batch_size * max(1, args.packing_examples // batch_size)
            lengths = skewed_lengths(count, seed=batch_size)
            examples = [
                (
                    torch.randint(1, MID["vocab_size"], (n,), generator=generator),
                    torch.randint(0, 3, (), generator=generator),
                )
                for n in lengths
            ]
            real = sum(lengths)
            plain = packing_batches("stock, padding", examples, batch_size, args.max_tokens)
            ideal = sum(b["input_ids"].numel() for b in plain) / real
            setups = {s: packing_batches(s, examples, batch_size, args.max_tokens) for s in PACKING_SETUPS}
            longest_row = max(b["input_ids"].shape[1] for b in setups["Stable, one row"])
            if longest_row > args.one_row_limit:  # eager/sdpa materialise a dense row x row mask and scores
                del setups["Stable, one row"]
            times = {s: [] for s in setups}
            losses, memory = {}, {}
            for round_ in range(args.packing_rounds + 1):  # round 0 warms up and measures memory; not timed
                for setup, batches in setups.items():
                    model = models["stock" if setup.startswith("stock") else "stable"]
                    start = time.perf_counter()
                    total = 0.0
                    for batch in batches:
                        batch = {k: v.to(args.device) for k, v in batch.items()}
                        losses_here = []

                        def step(model=model, batch=batch, out=losses_here):
                            loss = model(**batch).loss
                            loss.backward()
                            out.append(loss.item())

                        if round_ == 0:  # the largest batch's memory, not the first's
                            memory[setup] = max(memory.get(setup, 0), peak_bytes(step, args.device, True) / 2**20)
                        else:
                            step()
                        model.zero_grad(set_to_none=True)
                        total += losses_here[0] * len(batch["labels"])
                    sync(args.device)
                    if round_:
                        times[setup].append(time.perf_counter() - start)
                    losses[setup] = total / count
            for setup in PACKING_SETUPS:
                if setup not in setups:
                    gib = 4 * MID["num_attention_heads"] * longest_row**2 / 2**30
                    print(
                        f"{arch:7} {batch_size:5} {setup:22} skipped: one row of {longest_row} tokens "
                        f"({gib:.0f} GiB of "
                        "attention scores per layer)",
                        flush=True,
                    )
                    continue
                speed = real / statistics.median(times[setup])
                base = real / statistics.median(times["stock, padding"])
                print(
                    f"{arch:7} {batch_size:5} {setup:22} {speed:9.0f} {speed / base:7.2f}x {ideal:5.2f}x "
                    f"{speed / base / ideal:7.0%} {memory[setup]:10.1f} {losses[setup]:9.5f}",
                    flush=True,
                )


def bench_compile(args):
    print(f"\n## torch.compile (Stable, fp32, forward, batch {args.batch} x {args.length}, left padding)")
    for arch in args.archs:
        model = build(arch, "stable", "fp32", args.device).eval()
        ids, mask, _ = inputs(args.batch, args.length, True, args.device)
        compiled = torch.compile(model)
        with torch.no_grad():
            start = time.perf_counter()
            compiled_logits = compiled(ids, attention_mask=mask).logits
            compile_seconds = time.perf_counter() - start
            eager_logits = model(ids, attention_mask=mask).logits
            eager_call = functools.partial(model, ids, attention_mask=mask)
            compiled_call = functools.partial(compiled, ids, attention_mask=mask)
            eager = median_time(eager_call, args.warmup, args.repeats, args.device)
            fast = median_time(compiled_call, args.warmup, args.repeats, args.device)
        difference = (compiled_logits - eager_logits).abs().max().item()
        print(
            f"{arch:7} eager {1e3 * eager:8.1f} ms  compiled {1e3 * fast:8.1f} ms  speed-up {eager / fast:5.2f}x  "
            f"first call {compile_seconds:5.1f} s  max |logit difference| {difference:.1e}",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        nargs="+",
        default=["step", "throughput", "packing", "compile"],
        choices=["step", "throughput", "packing", "compile"],
    )
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--throughput-batches", type=int, default=6)
    parser.add_argument("--throughput-repeats", type=int, default=3)
    parser.add_argument("--packing-batch-sizes", nargs="+", type=int, default=[8, 32, 64, 128])
    parser.add_argument("--packing-examples", type=int, default=0, help="examples per batch size (default: one batch)")
    parser.add_argument("--packing-rounds", type=int, default=2)
    parser.add_argument("--packing-hidden", type=int, default=256, help="hidden size for the packing benchmark")
    parser.add_argument("--packing-layers", type=int, default=2, help="layers for the packing benchmark")
    parser.add_argument("--one-row-limit", type=int, default=8192, help="skip one-row packing above this row length")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="rows of at most N tokens (default: the longest example)"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*without fp32 master weights")  # bf16 weights train on purpose here
    if args.device == "cpu":
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    print(
        f"# stable_models {stable_models.__version__}, transformers {transformers.__version__}, torch "
        f"{torch.__version__}, {args.device}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads"
    )
    for part in args.only:
        parts = {"step": bench_step, "throughput": bench_throughput, "packing": bench_packing, "compile": bench_compile}
        parts[part](args)


if __name__ == "__main__":
    main()
