"""Where the time of `stable-models train` goes, for the README demo's run (SmolLM2-135M-Instruct, 320 Rotten
Tomatoes reviews, 100 for eval, 40 steps of 8, --lr 1e-3): launch to the first line, reading and loading, the
pre-flight, the training steps, the evaluations, and what follows the last step (merge, save). Prints the breakdown
and the share of the run after imports spent in training steps (goal: at least 75 %).

    ./dev demo --help >/dev/null                 # the demo's venv (cli extra)
    .venv/bin/python -m benchmarks.overhead      # model and data from PyPI wheels, cached

Stages come from the command's own output, each line stamped as it arrives, and from its training_log.json (the
Trainer's train_runtime and each evaluation's eval_runtime).
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from examples.cli_demo import CACHE, fetch, write_splits  # noqa: E402  (the demo's cache and data split)


def stamped_run(command) -> tuple[list[tuple[float, str]], float]:
    """The command's merged output lines with the seconds since launch at which each arrived, and the total wall."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = [(time.perf_counter() - started, line.rstrip()) for line in process.stdout]
    if process.wait() != 0:
        sys.exit("\n".join(line for _, line in lines[-30:]))
    return lines, time.perf_counter() - started


def first(lines, text) -> float:
    return next(at for at, line in lines if text in line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--dtype", default="auto", help="train's --dtype (auto: bf16 on CPUs with AVX512-BF16)")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-overhead")
    args = parser.parse_args()
    fetch("data")
    train, dev, _, _ = write_splits(CACHE / "data" / "rotten_tomatoes.jsonl", args.work / "data", 320, 0)
    output = args.work / "model"
    command = [sys.executable, "-m", "stable_models", "train", "--model", str(CACHE / "models" / "smollm2-135m")]
    command += ["--train", str(train), "--eval", str(dev), "--output", str(output), "--overwrite", "--batch-size", "8"]
    command += ["--max-steps", str(args.max_steps), "--lr", "1e-3", "--seed", "0", "--dtype", args.dtype]
    lines, wall = stamped_run(command)
    log = json.loads((output / "training_log.json").read_text())
    runtime = next(entry["train_runtime"] for entry in log if "train_runtime" in entry)
    evaluations = [entry["eval_runtime"] for entry in log if "eval_runtime" in entry]
    launched = first(lines, "[train] loading")
    preflight_done = first(lines, "pre-flight ok")
    before = max(at for at, line in lines if at <= preflight_done and "[train]" in line and "pre-flight" not in line)
    trained = first(lines, "train_runtime")
    steps = runtime - sum(evaluations)
    stages = [
        ("launch to the first line (imports, reading the data)", launched),
        ("loading the model, tokenizing", before - launched),
        ("pre-flight", preflight_done - before),
        (f"{args.max_steps} training steps", steps),
        (f"{len(evaluations)} evaluation(s) of 100 reviews", sum(evaluations)),
        ("Trainer start-up, checkpoints", trained - preflight_done - runtime),
        ("after the last step: merge, save", wall - trained),
    ]
    print("| stage | wall |\n|---|---:|")
    for name, seconds in stages:
        print(f"| {name} | {seconds:.1f} s |")
    print(f"| whole command | {wall:.1f} s |")
    print(
        f"\ntraining steps: {steps / (wall - launched):.0%} of the run after the first line; evaluation "
        f"{sum(evaluations) / runtime:.0%} of train_runtime"
    )


if __name__ == "__main__":
    main()
