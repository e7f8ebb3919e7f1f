"""The arguments of `stable-models`: the parser of every command, `--config` files, the required options. Imports
nothing heavy (no torch, no transformers), so `--help` and argument errors are instant.
"""

import argparse
import json
from pathlib import Path

from .errors import CliError
from .tasks import TASKS

DESCRIPTION = """`stable-models train | evaluate | predict | doctor`: from a data file to a calibrated classifier,
reward model or reranker, served as saved.

    stable-models train --model BASE --train data.csv --label-key label --output out/clf
    stable-models evaluate --model out/clf --data test.csv --calibrate
    stable-models predict --model out/clf --data new.jsonl --output scores.jsonl
    stable-models verify out/clf      # its code files are a stable_models release's (exit 0) or not (exit 1)

Bad input (a missing column, an empty file, mixed or NaN labels, an existing --output, ...) is one line on stderr and
exit code 2, before anything is written. Needs the `cli` extra (datasets, scikit-learn, matplotlib for the plots).
"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default once: appended where there is one to show (not None, not a flag's False) and the help
    does not already say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


ENCODING_HELP = "the text files' encoding, e.g. latin-1 or cp1252 (default: UTF-8)"
VERBOSE_HELP = "on an error, print the traceback of what failed underneath (datasets, pyarrow, transformers) above it"
GROUP_KEY_HELP = (
    "reward models: rank each response within the rows sharing this column (best-of-n); rerankers: rank each "
    "document within its query's rows (default: query)"
)
RANKING_LOSSES = ("listwise", "pointwise", "ranknet", "distillation")  # stable_models.losses.RANKING_LOSSES


def ranking_options(t) -> None:
    """train's options for rerankers (--task ranking, or query / pos / neg, query / positive / negative_N, ms-swift
    files)."""
    t.add_argument("--group-key", help="rerankers: group pointwise query / document / label rows by this column")
    t.add_argument(
        "--loss",
        choices=RANKING_LOSSES,
        help="rerankers: listwise softmax over each group (default; distillation where the file has teacher scores)",
    )
    t.add_argument(
        "--temperature",
        type=float,
        help="rerankers, embedders: scores are divided by it in the loss (default: 1; embedders 0.05)",
    )
    t.add_argument("--negatives", type=int, help="rerankers: sample N negatives per group, anew each epoch")
    t.add_argument(
        "--template",
        help="rerankers: pair (the tokenizer's text pair, default), qwen3 (Qwen3-Reranker's format) or a format string "
        "with {query}, {document} and {instruction}",
    )
    t.add_argument("--instruction", help="rerankers: the {instruction} of the template (qwen3 has a default)")
    t.add_argument(
        "--mine-negatives",
        type=int,
        help="rerankers, embedders: add K BM25 hard negatives per query from --corpus (bm25s)",
    )
    t.add_argument("--corpus", help="rerankers, embedders: a file of documents ('text' column) for --mine-negatives")
    t.add_argument(
        "--init-from-tokens",
        nargs=2,
        metavar=("YES", "NO"),
        help="rerankers: start the score head at W_lm[YES] - W_lm[NO], the causal LM's own log-odds",
    )
    t.add_argument(
        "--save-generative",
        action="store_true",
        help="rerankers trained with --init-from-tokens: also save OUTPUT/generative, a plain causal LM whose "
        "logit(YES) - logit(NO) is the score (vLLM's classifier_from_token, sentence-transformers' LogitScore)",
    )


# transformers' SchedulerType values that need no extra arguments
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="stable-models", description=DESCRIPTION, formatter_class=HelpFormatter)
    commands = top.add_subparsers(dest="command", metavar="{train,evaluate,predict,verify,doctor}")
    train_options(commands.add_parser("train", help="fine-tune a classifier", formatter_class=HelpFormatter))
    evaluate_options(
        commands.add_parser(
            "evaluate", help="metrics, calibration and plots on labelled data", formatter_class=HelpFormatter
        )
    )
    predict_options(
        commands.add_parser("predict", help="score a file into JSON lines or CSV", formatter_class=HelpFormatter)
    )
    v = commands.add_parser(
        "verify",
        help="check a folder's code files against the released stable_models code (before trust_remote_code=True)",
        formatter_class=HelpFormatter,
    )
    v.add_argument("folder", help="a folder saved by a Stable class")
    commands.add_parser("doctor", help="explain NaN / wrong results of a checkpoint (doctor --help)", add_help=False)
    return top


def reading(sub) -> None:
    sub.add_argument("--encoding", help=ENCODING_HELP)
    sub.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)


def data_keys(sub) -> None:
    sub.add_argument("--text-key", default="text", help="the column with the text")
    sub.add_argument("--text-pair-key", help="the column with the second text (rerankers, pair classification)")


def train_options(t) -> None:
    """train's options, in the order --help lists them."""
    train_files(t)
    recipe_options(t)
    classifier_loss_options(t)
    evaluation_options(t)
    task_choice(t)


def train_files(t) -> None:
    """What train reads and where it writes."""
    t.add_argument("--config", help="a YAML or JSON file with any of these options (the command line wins)")
    t.add_argument("--model", help="a causal LM or classifier folder (or its folder, with --gguf-file)")
    t.add_argument("--gguf-file", help="a GGUF file inside --model to load the weights from")
    t.add_argument("--train", help="CSV, TSV, JSON lines, JSON, Parquet, or a datasets.save_to_disk folder")
    reading(t)
    t.add_argument("--eval", help="an eval file in the same formats (default: --eval-fraction of --train)")
    t.add_argument("--eval-fraction", type=float, default=0.1, help="held out of --train when no --eval is given")
    data_keys(t)
    t.add_argument(
        "--label-key",
        default="label",
        help="the label column: strings or integers mean single-label, lists multi-label, floats regression",
    )
    t.add_argument("--output", help="the directory for the trained model (refused when not empty)")
    t.add_argument("--overwrite", action="store_true", help="write into a non-empty --output")
    t.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output")
    t.add_argument(
        "--keep-checkpoints", action="store_true", help="keep --output/checkpoints after a finished run (for --resume)"
    )


def recipe_options(t) -> None:
    """How it fine-tunes: steps, LoRA or full, parallelism, the optimizer, lengths and dtype, packing."""
    t.add_argument("--epochs", type=float, default=1.0, help="passes over the training data")
    t.add_argument("--max-steps", type=int, help="optimizer steps (overrides --epochs)")
    t.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    t.add_argument("--qlora", action="store_true", help="4-bit base weights with LoRA (needs bitsandbytes)")
    t.add_argument(
        "--save-adapter",
        action="store_true",
        help="keep the LoRA unmerged: OUTPUT is a peft adapter on --model (score in modules_to_save), for "
        "multi-adapter serving; predict, evaluate and verify take it",
    )
    t.add_argument("--lora-r", type=int, default=16, help="LoRA rank (alpha = 2 x rank) on every decoder linear")
    t.add_argument(
        "--lora-target", help="comma-separated module names for LoRA (default: every linear in the decoder layers)"
    )
    t.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the LoRA path")
    t.add_argument("--attn-implementation", help="eager, sdpa, flex_attention, ... (default: the model's own)")
    t.add_argument(
        "--deepspeed", help="zero2, zero3 (built-in configs) or a DeepSpeed JSON config; launch with torchrun"
    )
    t.add_argument("--fsdp", action="store_true", help="FSDP full sharding (GPUs); launch with torchrun")
    t.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations: less memory")
    t.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    t.add_argument("--warmup-ratio", type=float, default=0.05, help="share of the steps with a linear warm-up")
    t.add_argument("--scheduler", default="linear", choices=SCHEDULERS, help="learning-rate schedule after warm-up")
    t.add_argument("--lr", type=float, help="learning rate (default: 2e-4 with LoRA, 2e-5 full)")
    t.add_argument("--batch-size", type=int, default=8, help="examples per micro-batch")
    t.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps (exact: StableTrainer)")
    t.add_argument("--max-length", type=int, help="truncate texts to N tokens (default: the longest in the data)")
    t.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"], help="auto: bf16 where it is fast")
    t.add_argument("--pooling", default="last", choices=["last", "mean"], help="how a text becomes one vector")
    t.add_argument("--no-packing", action="store_true", help="pad instead of packing (recurrent models always pad)")


def classifier_loss_options(t) -> None:
    """A classifier's loss options (each refused where its problem type does not take it)."""
    t.add_argument("--class-weights", help="'balanced' or one weight per label, comma-separated (single-label)")
    t.add_argument("--label-smoothing", type=float, default=0.0, help="single-label cross-entropy smoothing")
    t.add_argument("--pos-weight", help="one positive weight per label, comma-separated (multi-label)")


def evaluation_options(t) -> None:
    """Evaluation during training, seeds and trackers."""
    t.add_argument(
        "--eval-steps",
        type=int,
        help="evaluate and save every N steps (default: up to 5 times, evaluation under 15%% of the run)",
    )
    t.add_argument(
        "--early-stopping", type=int, default=3, help="stop after N evaluations without improvement (0: off)"
    )
    t.add_argument("--seed", type=int, default=42, help="random seed (data split, head init, order)")
    t.add_argument(
        "--report-to",
        nargs="+",
        default=["none"],
        choices=["tensorboard", "trackio", "mlflow", "wandb", "none"],
        help="experiment trackers (Trainer's integrations), logging under --output/logs, offline where a service "
        "would be needed unless your environment configures one",
    )
    t.add_argument("--run-name", help="the run's name in the tracker (default: the --output folder's name)")


def task_choice(t) -> None:
    """The task, and the options of reward models and rerankers."""
    t.add_argument(
        "--task",
        default="auto",
        choices=["auto", *sorted(TASKS)],
        help="auto: preference (a reward model) for 'chosen' / 'rejected' columns, ranking (a reranker) for query / "
        "pos / neg, query / positive / negative_N or ms-swift's messages / positive_messages, else classification "
        "(the labels' kind decides); pointwise query / document / label rows need --task ranking; an embedding "
        "model from the same layouts (or anchor / positive / negatives) needs --task embedding",
    )
    t.add_argument(
        "--center-rewards",
        type=float,
        help="reward models: add COEF x (r_chosen + r_rejected)^2 to the loss (TRL's center_rewards_coefficient)",
    )
    ranking_options(t)
    t.add_argument("--query-prompt", help="embedders: text put before every query (saved: encode_query adds it)")
    t.add_argument("--document-prompt", help="embedders: text put before every document (saved with the model)")
    t.add_argument(
        "--include-prompt",
        action=argparse.BooleanOptionalAction,
        help="embedders, --pooling mean: --no-include-prompt leaves the prompt's tokens out of the mean (saved, as "
        "sentence-transformers' Pooling include_prompt)",
    )


def evaluate_options(e) -> None:
    e.add_argument("--config", help="a YAML or JSON file with any of these options")
    e.add_argument("--model", help="a classifier folder (from train)")
    e.add_argument("--data", help="labelled data, same formats as train")
    reading(e)
    data_keys(e)
    e.add_argument("--label-key", default="label", help="the label column (rerankers: the relevance of pointwise rows)")
    e.add_argument("--group-key", help="rerankers: group pointwise rows by this column (default: query)")
    e.add_argument("--calibrate", action="store_true", help="fit a temperature (and multi-label thresholds), save them")
    e.add_argument("--corpus", help="embedders: more documents ('text' column) to retrieve from, beside the file's")
    e.add_argument("--report-dir", help="where report.json and the plots go (default: MODEL/evaluation)")
    e.add_argument("--batch-size", type=int, default=16, help="texts per forward")


def predict_options(p) -> None:
    p.add_argument("--config", help="a YAML or JSON file with any of these options")
    p.add_argument("--model", help="a classifier folder (from train)")
    p.add_argument("--data", help="texts to score, same formats as train")
    reading(p)
    data_keys(p)
    p.add_argument("--output", help="a .jsonl, .csv or .parquet file (refused when it exists)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--batch-size", type=int, default=16, help="texts per forward")
    p.add_argument("--group-key", help=GROUP_KEY_HELP)
    p.add_argument("--top-k", type=int, help="rerankers: keep the K best documents of each query")
    p.add_argument(
        "--prompt-name", choices=["query", "document"], help="embedders: put the saved prompt of this name first"
    )
    p.add_argument(
        "--engine",
        default="torch",
        choices=["torch", "vllm", "ray"],
        help="vllm: vLLM's pooling runner (serving extra); ray: Ray Data actors, --data shards in, --output a "
        "folder of Parquet shards (ray extra)",
    )
    p.add_argument(
        "--ray-address", help="with --engine ray: an existing cluster (default: RAY_ADDRESS, or a local one)"
    )
    p.add_argument(
        "--actors", type=int, help="with --engine ray: scoring actors (default: one per GPU, or per 2 cores)"
    )
    p.add_argument("--cpus-per-actor", type=float, default=1.0, help="with --engine ray: cores each actor reserves")
    p.add_argument(
        "--gpus-per-actor", type=float, help="with --engine ray: GPUs per actor (a fraction shares one; default 1)"
    )
    p.add_argument(
        "--block-rows",
        type=int,
        help="with --engine ray: rows per output file, the unit of work and of retry (default: 4 blocks an actor, "
        "100 to 100000 rows)",
    )
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="with --engine vllm: GPUs per model copy")
    p.add_argument("--data-parallel-size", type=int, default=1, help="with --engine vllm: model copies")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="with --engine vllm: vLLM's share of the memory (on CPU: of RAM, which it checks is free at start)",
    )
    p.add_argument(
        "--vllm-dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16", "auto"],
        help="with --engine vllm: float32 gives the torch path's scores; bfloat16 is faster on GPUs",
    )


REQUIRED = {
    "train": ("model", "train", "output"),
    "evaluate": ("model", "data"),
    "predict": ("model", "data", "output"),
    "verify": (),
}


def parse(argv) -> argparse.Namespace:
    top = parser()
    args = top.parse_args(argv)
    if args.command is None:
        top.print_help()
        raise SystemExit(2)
    if getattr(args, "config", None):
        sub = top._subparsers._group_actions[0].choices[args.command]
        known = {a.dest for a in sub._actions} - {"help", "config"}
        options = read_options(args.config)
        unknown = sorted(set(options) - known)
        if unknown:
            raise CliError(f"--config {args.config}: unknown options {unknown}; known: {sorted(known)}")
        sub.set_defaults(**options)
        args = top.parse_args(argv)
    args.given = given_options(argv, read_options(args.config) if getattr(args, "config", None) else {})
    missing = [name for name in REQUIRED[args.command] if getattr(args, name) in (None, "")]
    if missing:
        raise CliError(f"{args.command} needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
    return args


def given_options(argv, config_options: dict) -> set:
    """The options the user set, on the command line or in --config, whatever their value (one equal to the default
    is given too): argv parsed again with every default suppressed, so only what argv names lands in the namespace."""
    top = parser()
    for sub in top._subparsers._group_actions[0].choices.values():
        for action in sub._actions:
            action.default = argparse.SUPPRESS
    return (set(vars(top.parse_args(argv))) - {"command"}) | set(config_options)


def read_options(path) -> dict:
    source = Path(path)
    if not source.is_file():
        raise CliError(f"--config {path}: no such file")
    text = source.read_text()
    try:
        if source.suffix in (".yaml", ".yml"):
            import yaml

            options = yaml.safe_load(text)
        else:
            options = json.loads(text)
    except Exception as error:
        raise CliError(f"--config {path}: cannot be read ({str(error).splitlines()[0]})") from None
    if not isinstance(options, dict):
        raise CliError(f"--config {path}: must hold a mapping of option names to values")
    return {key.replace("-", "_"): value for key, value in options.items()}


DOCTOR_DESCRIPTION = """`python -m stable_models doctor --model DIR`: explain why a sequence-classification run gives
NaN or
nonsense.

Loads the tokenizer and the model from a local folder, builds padded batches, runs forward and backward with the
stock class and the Stable class side by side, and prints what is wrong and what to change. Exit code 0 when the
Stable class is healthy on this checkpoint and data, 1 otherwise.
"""


def doctor_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stable_models doctor", description=DOCTOR_DESCRIPTION, formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--model", help="local folder with config, weights and tokenizer (a base model or a classifier)"
    )
    parser.add_argument(
        "--data", help="a text and, optionally, a label (int or string) per row, in any format train reads"
    )
    parser.add_argument("--text-key", default="text", help="the column of the text in --data")
    parser.add_argument("--label-key", default="label", help="the column of the label in --data")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"], help="dtype to load the model in")
    parser.add_argument("--padding-side", choices=["left", "right"], help="default: the tokenizer's")
    parser.add_argument("--max-examples", type=int, default=16, help="texts used from --data")
    parser.add_argument("--log", help="instead of a model: explain a Trainer log (trainer_state.json or a text log)")
    parser.add_argument("--num-labels", type=int, help="with --log: number of classes (default: guessed from the loss)")
    return parser
