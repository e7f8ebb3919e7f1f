"""`stable-models predict` on the torch forward vs `--engine vllm` (vLLM's pooling runner), same file, same model:
rows/s of each whole command (start-up included) and the largest probability difference. Run it in the serving venv:

    ./dev serve-test --collect-only -q >/dev/null   # sets .venv-serve up once
    .venv-serve/bin/python -m benchmarks.predict_engines --rows 10000

A tiny random Stable Llama classifier (hidden 64: vLLM's CPU attention needs head_dim >= 32), rows of 50-250 words
(benchmarks/data_path.py). The two engines alternate, --repeats times each; the median is reported.
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

from benchmarks.data_path import make_csv, make_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "stable-models-engines"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, data = work / "classifier", work / f"rows-{args.rows}.csv"
    if not (model / "config.json").exists():
        make_model(model, hidden=64, classifier=True)
    if not data.exists():
        make_csv(data, args.rows)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    walls = {"torch": [], "vllm": []}
    for _ in range(args.repeats):
        for engine in walls:
            output = work / f"{engine}.jsonl"
            command = [sys.executable, "-m", "stable_models", "predict", "--model", str(model), "--data", str(data)]
            command += ["--output", str(output), "--overwrite", "--engine", engine]
            if engine == "vllm":  # vLLM on CPU wants 92 % of RAM free at start; the page cache of big files counts
                command += ["--gpu-memory-utilization", "0.5"]
            start = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True)
            walls[engine].append(time.perf_counter() - start)
    rows = {e: [json.loads(line) for line in (work / f"{e}.jsonl").read_text().splitlines()] for e in walls}
    same_labels = [r["label"] for r in rows["torch"]] == [r["label"] for r in rows["vllm"]]
    difference = max(
        abs(t["probabilities"][k] - v["probabilities"][k])
        for t, v in zip(rows["torch"], rows["vllm"], strict=True)
        for k in t["probabilities"]
    )
    print(f"| engine | rows | wall (median of {args.repeats}) | rows/s |\n|---|---:|---:|---:|")
    for engine, times in walls.items():
        wall = statistics.median(times)
        print(f"| {engine} | {args.rows:,} | {wall:.1f} s | {args.rows / wall:.0f} |")
    print(f"labels identical: {same_labels}; largest probability difference: {difference:.2e}")


if __name__ == "__main__":
    main()
