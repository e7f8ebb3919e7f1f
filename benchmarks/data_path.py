"""The CLI's data path at 10k / 100k / 1M rows: peak memory and wall time of `stable-models train` (2 steps),
`evaluate` and `predict`, the Arrow path beside the old Python-lists path (a git worktree of --old-ref), in one run.

    .venv/bin/python -m benchmarks.data_path    # train at 10k, 100k, 1M; evaluate / predict and the old path to 100k
    .venv/bin/python -m benchmarks.data_path --sizes 2000 --old-max 2000 --commands train   # a quick look
    .venv/bin/python -m benchmarks.data_path --pairs --sizes 100000   # a reward model on preference pairs

A tiny random Llama (hidden 32, 2 layers) and a word-level tokenizer, so the model costs little and the data path is
what is measured; rows of 50-250 words, 3 string labels, as CSV. With --pairs: JSON lines of TRL's explicit-prompt
preference layout (a prompt of 20-60 words, chosen and rejected responses of 25-120 words each), the new path only.
`train` holds out 1 % for its evaluations (both paths alike), so scoring the held-out rows does not swamp the
figure. Memory is the peak of the command's process tree (tokenizer workers included), sampled every 100 ms; each
command starts with an empty datasets cache, so the Arrow conversion is inside the figure.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORDS = [f"w{i:04d}" for i in range(2000)]
LABELS = ["positive", "negative", "neutral"]


def make_model(folder: Path, hidden: int = 32, classifier: bool = False) -> None:
    """A tiny random Llama (causal LM, or a Stable classifier with 3 labels) and its word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<eos>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>", model_max_length=4096
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=2,
    )
    if classifier:
        import stable_models

        config.id2label = dict(enumerate(LABELS))
        config.label2id = {name: i for i, name in enumerate(LABELS)}
        stable_models.StableLlamaForSequenceClassification(config).save_pretrained(folder)
    else:
        LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(folder)
    text = " ".join(WORDS[:5])
    assert reloaded.decode(reloaded(text)["input_ids"]) == text, "the tokenizer must round-trip"


def make_csv(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as handle:
        handle.write("text,label\n")
        for _ in range(rows):
            words = rng.choices(WORDS, k=rng.randint(50, 250))
            handle.write(f"{' '.join(words)},{rng.choice(LABELS)}\n")


def make_pairs(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)

    def words(low: int, high: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))

    with open(path, "w") as handle:
        for _ in range(rows):
            row = {"prompt": words(20, 60), "chosen": words(25, 120), "rejected": words(25, 120)}
            handle.write(json.dumps(row) + "\n")


def measure(command: list[str], env: dict) -> dict:
    """Wall seconds and the peak memory (GB) of the command's process tree: the summed PSS (proportional set size:
    a page shared by the tokenizer workers and their parent, or mapped from the Arrow file by several of them, counts
    once in all), and the summed RSS beside it (which counts such pages once per process)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errors:  # a pipe would fill up with progress bars and stall the command
        process = psutil.Popen(  # cwd: the work folder, so PYTHONPATH (not the current directory) picks the code
            command, env=env, cwd=env["HF_DATASETS_CACHE"], stdout=subprocess.DEVNULL, stderr=errors, text=True
        )
        peak_pss, peak_rss = 0, 0
        while process.poll() is None:
            try:
                tree = [process, *process.children(recursive=True)]
                memory = [p.memory_full_info() for p in tree]
                peak_pss = max(peak_pss, sum(m.pss for m in memory))
                peak_rss = max(peak_rss, sum(m.rss for m in memory))
            except (psutil.Error, OSError):
                pass
            time.sleep(0.1)
        wall = time.perf_counter() - start
        errors.seek(0)
        error = errors.read()
    return {
        "ok": process.returncode == 0,
        "wall_s": wall,
        "peak_gb": peak_pss / 1e9,
        "peak_rss_gb": peak_rss / 1e9,
        "error": error[-800:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--old-max", type=int, default=100_000, help="largest size the old path is run at")
    parser.add_argument("--old-ref", default="5ad8903", help="the commit with the Python-lists data path")
    parser.add_argument("--commands", nargs="+", default=["train", "evaluate", "predict"])
    parser.add_argument("--score-max", type=int, default=100_000, help="largest size evaluate and predict run at")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "stable-models-data-path"))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--pairs", action="store_true", help="preference pairs (a reward model), the new path only")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    old = work / "old"
    if not old.exists():
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(old), args.old_ref], check=True)
    if not (work / "model" / "config.json").exists():
        make_model(work / "model")
    paths = {"new (Arrow)": root} if args.pairs else {"old (lists)": old, "new (Arrow)": root}
    results = []
    for size in args.sizes:
        data = work / (f"pairs-{size}.jsonl" if args.pairs else f"rows-{size}.csv")
        if not data.exists():
            (make_pairs if args.pairs else make_csv)(data, size)
        for name, code in paths.items():
            if name.startswith("old") and size > args.old_max:
                continue
            out = work / f"out-{size}-{name.split()[0]}{'-pairs' if args.pairs else ''}"
            for command in args.commands:
                if command != "train" and size > args.score_max:
                    continue  # the tiny model scores ~500 rows/s on 2 cores: 1M rows would take over half an hour
                argv = {
                    "train": [
                        "--model",
                        work / "model",
                        "--train",
                        data,
                        "--output",
                        out,
                        "--overwrite",
                        "--max-steps",
                        "2",
                        "--eval-steps",
                        "2",
                        "--batch-size",
                        "8",
                        "--dtype",
                        "fp32",
                        "--eval-fraction",
                        "0.01",
                    ],
                    "evaluate": ["--model", out, "--data", data, "--report-dir", out / "evaluation"],
                    "predict": ["--model", out, "--data", data, "--output", out / "predictions.jsonl", "--overwrite"],
                }[command]
                with tempfile.TemporaryDirectory(dir=work) as cache:
                    env = {
                        **os.environ,
                        "PYTHONPATH": str(code),
                        "HF_DATASETS_CACHE": cache,
                        "HF_HUB_OFFLINE": "1",
                        "TOKENIZERS_PARALLELISM": "false",
                    }
                    row = {
                        "rows": size,
                        "path": name,
                        "command": command,
                        **measure([sys.executable, "-m", "stable_models", command, *map(str, argv)], env),
                    }
                row["us_per_row"] = row["wall_s"] / size * 1e6
                results.append(row)
                status = "" if row["ok"] else "  FAILED: " + row["error"].strip().splitlines()[-1]
                print(
                    f"{size:>9} {name:12} {command:9} {row['wall_s']:8.1f} s {row['peak_gb']:6.2f} GB "
                    f"(RSS {row['peak_rss_gb']:.2f} GB) {row['us_per_row']:8.0f} us/row{status}",
                    flush=True,
                )
    print("\n| rows | command | path | wall | per row | peak memory (PSS) | peak RSS |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for r in results:
        wall = f"{r['wall_s']:.0f} s" if r["ok"] else "failed"
        print(
            f"| {r['rows']:,} | {r['command']} | {r['path']} | {wall} | {r['us_per_row']:.0f} µs | "
            f"{r['peak_gb']:.2f} GB | {r['peak_rss_gb']:.2f} GB |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
