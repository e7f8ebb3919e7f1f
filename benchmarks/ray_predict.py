"""`stable-models predict --engine ray` (2 actors of one core on a local Ray cluster) against `torchrun` predict on
the same 2 processes: the wall time of each whole command (start-up included), alternating, and the largest
probability difference; then the peak resident memory of an actor at --memory-rows rows of a tiny model, beside a
tenth of them (flat in rows: the same). Needs the ray extra (./dev ray-test sets it up):

    .venv/bin/python -m benchmarks.ray_predict --rows 10000 --repeats 2

The classifier is SmolLM2-135M-Instruct with a fresh 2-label head (the demo's classifier's compute; fetched from a
PyPI wheel, cached), or with --model tiny a random hidden-64 Llama, on Rotten Tomatoes reviews. One torch thread per
process (torchrun's and Ray's default).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.data_path import make_csv, make_model

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("STABLE_MODELS_CACHE", Path.home() / ".cache" / "stable_models"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}


def smollm_classifier(folder: Path) -> None:
    """SmolLM2-135M-Instruct as a Stable Llama classifier with a fresh head: the demo's compute, no training."""
    import torch
    from transformers import AutoTokenizer

    import stable_models

    fetch = [sys.executable, str(ROOT / "scripts" / "fetch_real_checkpoints.py"), "--only", "smollm2-135m", "data"]
    subprocess.run(fetch, check=True, stdout=subprocess.DEVNULL)
    base = CACHE / "models" / "smollm2-135m"
    model = stable_models.StableLlamaForSequenceClassification.from_pretrained(base, num_labels=2, dtype=torch.float32)
    model.config.id2label, model.config.label2id = {0: "rotten", 1: "fresh"}, {"rotten": 0, "fresh": 1}
    tokenizer = AutoTokenizer.from_pretrained(base)
    stable_models.setup_pad_token(tokenizer, model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def reviews(path: Path, rows: int) -> None:
    fetch = [sys.executable, str(ROOT / "scripts" / "fetch_real_checkpoints.py"), "--only", "data"]
    subprocess.run(fetch, check=True, stdout=subprocess.DEVNULL)
    lines = (CACHE / "data" / "rotten_tomatoes.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    path.write_text("".join(json.dumps({"id": i, "text": texts[i % len(texts)]}) + "\n" for i in range(rows)))


def predict(engine: str, model: Path, data: Path, output: Path) -> float:
    base = ["predict", "--model", str(model), "--data", str(data), "--output", str(output), "--overwrite"]
    if engine == "ray":
        command = [sys.executable, "-m", "stable_models", *base, "--engine", "ray", "--actors", "2"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "stable_models", *base]
    start = time.perf_counter()
    done = subprocess.run(command, env=ENV, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - start


def memory(work: Path, rows: int) -> float:
    """An actor's peak resident memory (MB) over a run of `rows` rows of a tiny classifier."""
    model, csv, data = work / "tiny", work / f"tiny-{rows}.csv", work / f"tiny-{rows}"
    if not (model / "config.json").exists():
        make_model(model, hidden=32, classifier=True)
    if not data.exists():
        make_csv(csv, rows)
        data.mkdir()
        lines = csv.read_text().splitlines()[1:]
        texts = [line.rsplit(",", 1)[0] for line in lines]
        (data / "rows.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    output = work / f"tiny-out-{rows}"
    predict("ray", model, data, output)
    return json.loads((output / "_SUCCESS.json").read_text())["peak_actor_rss_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-rows", type=int, default=100_000)
    parser.add_argument(
        "--model",
        default="smollm2",
        choices=["smollm2", "tiny"],
        help="smollm2: the demo's compute (about 0.5 s a review on one AVX2 core); tiny: the start-up and I/O costs",
    )
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "stable-models-ray"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, data = work / f"{args.model}-classifier", work / f"reviews-{args.rows}"
    if not (model / "config.json").exists():
        smollm_classifier(model) if args.model == "smollm2" else make_model(model, hidden=64, classifier=True)
    if not data.exists():
        data.mkdir()
        reviews(data / "reviews.jsonl", args.rows)
    walls = {"torchrun": [], "ray": []}
    for _ in range(args.repeats):
        for engine in walls:
            output = work / ("torchrun.jsonl" if engine == "torchrun" else "ray-out")
            walls[engine].append(
                predict(engine, model, data / "reviews.jsonl" if engine == "torchrun" else data, output)
            )
    lines = (work / "torchrun.jsonl").read_text().split("\n")  # not splitlines: reviews hold U+2028
    theirs = [json.loads(line) for line in lines if line]
    ours = sorted((r for p in (work / "ray-out").glob("*.parquet") for r in pq.read_table(p).to_pylist()),
                  key=lambda r: r["id"])  # fmt: skip
    difference = max(abs(t["probabilities"][k] - o["probabilities"][k]) for t, o in zip(theirs, ours, strict=True)
                     for k in t["probabilities"])  # fmt: skip
    print(f"| engine (2 processes) | rows | wall, median of {args.repeats} | rows/s |\n|---|---:|---:|---:|")
    for engine, times in walls.items():
        wall = statistics.median(times)
        print(f"| {engine} | {args.rows:,} | {wall:.1f} s | {args.rows / wall:.0f} |")
    ratio = statistics.median(walls["torchrun"]) / statistics.median(walls["ray"])
    print(f"ray / torchrun speed: {ratio:.2f}x (walls {walls}); largest probability difference {difference:.1e}")
    if not args.memory_rows:
        return
    small, large = memory(work, args.memory_rows // 10), memory(work, args.memory_rows)
    print(f"peak actor memory, tiny classifier: {small:.0f} MB at {args.memory_rows // 10:,} rows, "
          f"{large:.0f} MB at {args.memory_rows:,} rows")  # fmt: skip


if __name__ == "__main__":
    main()
