"""`stable-models train | evaluate | predict`: the commands, each a sequence of named steps over data.py (reading
and checking), training_setup.py (model, adapters, Trainer), calibration.py (metrics, temperature, thresholds),
plots.py, and rewards.py where the model is a reward model. cli.py parses the arguments.
"""

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from .calibration import calibrate_logits, metrics, probabilities, save_in_place, stream_logits
from .data import (
    CliError,
    check_known_labels,
    check_texts,
    column_max,
    encode_labels,
    encoded,
    label_counts,
    label_names,
    labelled,
    read_table,
    split_eval,
)
from .distributed import Job, output_lock, refuse_if_locked
from .plots import plot_report, write_report
from .training_setup import (
    load_base_model,
    make_trainer,
    merged_model,
    training_arguments,
    with_adapters,
    zero3_gathered,
)


def fast_dtype() -> str:
    """bf16 where its matmuls are fast (CUDA with bf16, CPUs with AVX512-BF16 / AMX), else fp32: on an AVX2-only CPU a
    bf16 matmul is ~95x slower than fp32."""
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "fp32"
    return "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def check_model_path(model: str, gguf_file: str | None) -> None:
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        raise CliError(f"--model {model} is a GGUF file: pass its folder as --model and the name as --gguf-file")
    if path.exists() and not path.is_dir():
        raise CliError(f"--model {model}: not a checkpoint folder")
    if path.is_dir():
        wanted = path / gguf_file if gguf_file else path / "config.json"
        if not wanted.is_file():
            raise CliError(
                f"--model {model}: not a checkpoint (no {wanted.name}); point at a folder from save_pretrained"
            )


def load_tokenizer(model: str, gguf_file=None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as error:
        raise CliError(f"--model {model}: no tokenizer could be loaded ({str(error).splitlines()[0]})") from None


def classifier_config(model: str):
    """The config of a classifier folder saved by `train` (or any Stable / stock classifier folder), checked."""
    from transformers import AutoConfig

    check_model_path(model, None)
    if not Path(model).is_dir():
        raise CliError(f"--model {model}: no such folder")
    config = json.loads((Path(model) / "config.json").read_text())
    classes = config.get("architectures") or []
    if "AutoModelForSequenceClassification" not in (config.get("auto_map") or {}) and not any(
        name.endswith("ForSequenceClassification") for name in classes
    ):
        raise CliError(
            f"--model {model}: not a classifier ({', '.join(classes) or 'no architectures'}); train one first"
        )
    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError, KeyError) as error:
        raise CliError(f"--model {model}: {str(error).splitlines()[0]}") from None


def load_classifier(model: str, device=None):
    """A classifier folder in fp32, eval mode, on `device` (default: the CPU), with its tokenizer."""
    import stable_models

    classifier_config(model)
    try:
        classifier = stable_models.from_pretrained(model, dtype=torch.float32)
    except (OSError, ValueError, TypeError) as error:
        raise CliError(f"--model {model}: {str(error).splitlines()[0]}") from None
    tokenizer = load_tokenizer(model)
    if tokenizer.pad_token_id is None:
        from .tokenization import setup_pad_token

        setup_pad_token(tokenizer)
    return classifier.to(device or "cpu").eval(), tokenizer


def check_output_dir(output: Path, overwrite: bool, resume: bool) -> None:
    if output.exists() and not output.is_dir():
        raise CliError(f"--output {output} is a file; give a directory")
    if output.is_dir():
        refuse_if_locked(output)
    if output.is_dir() and any(output.iterdir()) and not (overwrite or resume):
        raise CliError(f"--output {output} exists and is not empty; pass --overwrite, --resume, or another directory")


def first_examples(train_set, task) -> tuple[list, list, torch.dtype]:
    """The pre-flight's examples: the first 8 rows' token ids and labels (for pairs, the first pairs' responses)."""
    if task == "preference":
        from .rewards import preflight_examples

        return preflight_examples(train_set)
    first = train_set[: min(8, len(train_set))]
    return first["input_ids"], first["labels"], torch.long if task == "single_label_classification" else torch.float32


def preflight(model, tokenizer, train_set, task, folder) -> None:
    """The doctor's checks on the first examples: finite loss and gradients, padding-invariant logits, an fp32 loss
    that honours num_items_in_batch. Stops with the doctor's report when one fails."""
    from .doctor import PADDING_TOLERANCE, run_one

    ids, labels, dtype = first_examples(train_set, task)
    batch = dict(tokenizer.pad({"input_ids": ids}, return_tensors="pt"))
    alone = [dict(tokenizer.pad({"input_ids": [one]}, return_tensors="pt")) for one in ids]
    result = run_one(model, batch, alone, torch.tensor(labels, dtype=dtype))
    model.train()
    tolerance = PADDING_TOLERANCE[torch.float32] * max(1.0, result["logit scale"])
    problems = []
    if not result["finite"]:
        problems.append(f"non-finite loss, logits or gradients (first at {result['first non-finite']})")
    elif result["padding error"] > tolerance:
        problems.append(f"padding changes the logits by {result['padding error']:.2e}")
    elif not result["honours num_items_in_batch"] or result["loss dtype"] != torch.float32:
        problems.append("the loss is not an fp32 loss that honours num_items_in_batch")
    if problems:
        raise SystemExit(
            f"stable-models: the pre-flight check failed: {problems[0]}. `python -m stable_models doctor --model "
            f"{folder}` gives the full report."
        )
    print(f"[train] pre-flight ok: finite, padding changes logits by {result['padding error']:.1e}", file=sys.stderr)


@dataclass
class LabelledData:
    """The training and eval tables of `train` (datasets, memory-mapped), checked, with one label map."""

    train: object
    eval: object
    task: str  # one of data.TASKS, or "preference" (pairs for a reward model)
    names: list
    layouts: tuple = ()  # preference.Layout of the train and eval pairs

    @property
    def label2id(self) -> dict:
        return {name: i for i, name in enumerate(self.names)}


def read_training_data(args, say=print) -> LabelledData:
    """--train (and --eval, or a held-out --eval-fraction of --train), checked: one label kind, at least two classes,
    every eval label known. Preference pairs (TRL's layouts) where --task says so or the columns do."""
    from .rewards import wants_preference

    table = read_table(args.train)
    if wants_preference(table, args.task):
        return read_preference_data(args, table, say)
    task = labelled(table, args, args.train)
    if args.eval:
        eval_table = read_table(args.eval)
        eval_task = labelled(eval_table, args, args.eval)
        if eval_task != task:
            raise CliError(f"the eval labels are {eval_task}, the training labels {task}; make them one kind")
    else:
        table, eval_table = split_eval(table, args.eval_fraction, args.seed)
    names = label_names(table, args.label_key, task) if task != "regression" else ["score"]
    if task == "single_label_classification" and len(names) < 2:
        raise CliError(f"{args.train}: only one label ({names[0]!r}); a classifier needs at least two")
    label2id = {name: i for i, name in enumerate(names)}
    check_known_labels(eval_table, args.label_key, task, label2id, args.eval or "the held-out rows")
    return LabelledData(table, eval_table, task, names)


def read_preference_data(args, table, say=print) -> LabelledData:
    """--train (and --eval, or a held-out --eval-fraction) as checked preference pairs of one layout."""
    from .rewards import REWARD, read_pairs

    layouts = [read_pairs(table, args.train, say)]
    if args.eval:
        eval_table = read_table(args.eval)
        layouts.append(read_pairs(eval_table, args.eval, say))
    else:
        table, eval_table = split_eval(table, args.eval_fraction, args.seed)
        layouts.append(layouts[0])
    return LabelledData(table, eval_table, "preference", [REWARD], tuple(layouts))


def loading_options(args, data: LabelledData) -> dict:
    """`from_pretrained` arguments for the classifier: the label map, the task, pooling and the loss options."""
    options = {}
    if args.class_weights:
        if data.task != "single_label_classification":
            raise CliError("--class-weights applies to single-label classification")
        options["class_weights"] = class_weights(args.class_weights, data, args.label_key)
    if args.label_smoothing:
        if data.task != "single_label_classification":
            raise CliError("--label-smoothing applies to single-label classification")
        options["label_smoothing"] = args.label_smoothing
    if args.center_rewards and data.task != "preference":
        raise CliError("--center-rewards applies to reward models (preference data)")
    if args.pos_weight:
        if data.task != "multi_label_classification":
            raise CliError("--pos-weight applies to multi-label classification")
        options["pos_weight"] = parse_weights(args.pos_weight, "--pos-weight", len(data.names))
    load = dict(
        num_labels=len(data.names),
        id2label=dict(enumerate(data.names)),
        label2id={name: i for i, name in enumerate(data.names)},
        problem_type="regression" if data.task == "preference" else data.task,  # a reward: one unbounded output
        pooling=args.pooling,
        dtype=torch.float32,
        ignore_mismatched_sizes=True,
        **options,
    )
    if args.gguf_file:
        load["gguf_file"] = args.gguf_file
    if args.attn_implementation:
        load["attn_implementation"] = args.attn_implementation
    return load


def tokenized_sets(args, tokenizer, model, data: LabelledData, say=print) -> tuple:
    """(train, eval) tables of token ids, lengths and labels, truncated to --max-length and the model's positions
    (a cached `map`); the tokenizer remembers the longest, so evaluate and predict truncate where training did.
    Pairs: rewards.training_pairs."""
    if data.task == "preference":
        from .rewards import training_pairs

        return training_pairs(args, tokenizer, model, data, say)
    limit = min(args.max_length or 10**9, getattr(model.config.get_text_config(), "max_position_embeddings", 10**9))
    train_set = encoded(data.train, tokenizer, args, data.task, data.label2id, limit)
    eval_set = encoded(data.eval, tokenizer, args, data.task, data.label2id, limit)
    tokenizer.model_max_length = max(column_max(train_set, "length"), column_max(eval_set, "length"))
    return train_set, eval_set


def write_training_outputs(model, tokenizer, output: Path, history: list, final: dict) -> dict:
    """The model, its tokenizer, the training log and the final eval metrics (returned without the eval_ prefix)."""
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    (output / "training_log.json").write_text(json.dumps(history, indent=1))
    summary = {k.removeprefix("eval_"): v for k, v in final.items() if isinstance(v, (int, float))}
    (output / "eval_metrics.json").write_text(json.dumps(summary, indent=1))
    return summary


def train(args) -> int:
    import transformers

    from .tokenization import setup_pad_token

    job = Job()
    output = Path(args.output)
    job.on_main(lambda: check_output_dir(output, args.overwrite, args.resume))
    if args.full and args.qlora:
        raise CliError("--full and --qlora exclude each other")
    check_model_path(args.model, args.gguf_file)
    data = job.main_first(lambda: read_training_data(args, job.say))  # the first reader fills datasets' Arrow cache
    transformers.set_seed(args.seed)
    dtype = fast_dtype() if args.dtype == "auto" else args.dtype
    load = loading_options(args, data)
    tokenizer = load_tokenizer(args.model, args.gguf_file)
    checkpoints = output / "checkpoints"
    training = training_arguments(args, data, dtype, checkpoints)  # before the model: ZeRO-3 partitions at build
    with output_lock(output, job):
        kind = "reward" if data.task == "preference" else data.task.replace("_", " ")
        job.say(f"[train] loading {args.model} as a {kind} model with {len(data.names)} output(s)", file=sys.stderr)
        model = load_base_model(args, load, dtype)
        setup_pad_token(tokenizer, model)
        if data.task == "preference":
            from .rewards import check_renderable, rendering

            for layout, path in zip(data.layouts, (args.train, args.eval or args.train), strict=True):
                check_renderable(layout, tokenizer, args.model, path)
            job.say(
                f"[train] preference pairs ({data.layouts[0].describe()}): {rendering(data.layouts[0], tokenizer)}",
                file=sys.stderr,
            )
        train_set, eval_set = job.main_first(lambda: tokenized_sets(args, tokenizer, model, data, job.say))
        pairs = data.task == "preference"
        longest = column_max(train_set, "longer") if pairs else tokenizer.model_max_length
        job.say(
            f"[train] {len(train_set)} train / {len(eval_set)} eval {'pairs' if pairs else 'examples'}"
            f", max length {longest}, {dtype}" + (f", {job.world} processes" if job.world > 1 else ""),
            file=sys.stderr,
        )
        if training.deepspeed and training.hf_deepspeed_config.is_zero3():
            job.say("[train] pre-flight skipped: ZeRO-3 holds each parameter in slices", file=sys.stderr)
        else:
            # rank 0 alone (it leaves the weights as they were; Trainer seeds every rank alike afterwards)
            job.on_main(lambda: preflight(model, tokenizer, train_set, data.task, args.model))
        model = with_adapters(model, args)
        trainer = make_trainer(training, model, tokenizer, data, train_set, eval_set, args)
        resume = args.resume and any(checkpoints.glob("checkpoint-*"))
        if args.resume and not resume:
            job.say(f"[train] --resume: no checkpoint in {checkpoints}, starting from step 0", file=sys.stderr)
        trainer.train(resume_from_checkpoint=True if resume else None)
        history = list(trainer.state.log_history)
        final = trainer.evaluate()  # the best checkpoint's, which load_best_model_at_end restored
        with zero3_gathered(trainer.model, training):
            summary = job.on_main(
                lambda: write_training_outputs(
                    merged_model(trainer.model, args, load, tokenizer, checkpoints), tokenizer, output, history, final
                )
            )
    keys = ("accuracy", "f1_macro", "mse", "margin_mean", "loss", "ece")
    shown = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k in keys)
    job.say(f"[train] done: {shown}")
    job.say(
        f"[train] model: {output} (stable_models.from_pretrained(dir), or AutoModelForSequenceClassification "
        "with trust_remote_code=True)"
    )
    job.say(f"[train] next: stable-models evaluate --model {output} --data <test file> --calibrate")
    job.say(f"[train] serve: python -m vllm.entrypoints.openai.api_server --model {output} --runner pooling")
    job.leave()
    return 0


def parse_weights(text: str, flag: str, count: int) -> list[float]:
    try:
        weights = [float(w) for w in str(text).split(",")]
    except ValueError:
        raise CliError(f"{flag} {text!r}: give {count} comma-separated numbers, in label order") from None
    if len(weights) != count or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise CliError(f"{flag} {text!r}: give {count} finite, non-negative numbers, in label order")
    return weights


def class_weights(value: str, data: LabelledData, key: str) -> list[float]:
    """`balanced` (n / (classes x count) over the training rows, as scikit-learn) or one weight per label."""
    names = data.names
    if value != "balanced":
        return parse_weights(value, "--class-weights", len(names))
    counts = label_counts(data.train, key, names)
    return [len(data.train) / (len(names) * c) if c else 0.0 for c in counts]


def shard_stream(job: Job, model, tokenizer, table, args):
    """(texts, logits) of this rank's contiguous shard of the rows, in row order, as they are scored."""
    rows = job.shard(len(table))
    return stream_logits(
        model, tokenizer, table, args.text_key, args.text_pair_key, rows, args.batch_size, progress=job.is_main
    )


def sharded_logits(job: Job, model, tokenizer, table, args) -> torch.Tensor | None:
    """Logits of every row in row order: each rank scores its contiguous shard, rank 0 gets them all (None on the
    other ranks)."""
    parts = [logits for _, logits in shard_stream(job, model, tokenizer, table, args)]
    gathered = job.gather(torch.cat(parts) if parts else None)
    return None if gathered is None else torch.cat([p for p in gathered if p is not None])


def evaluate(args) -> int:
    from . import rewards

    job = Job()
    model, tokenizer = load_classifier(args.model, job.device)
    if rewards.is_reward_model(model.config):
        rewards.evaluate(args, job, model, tokenizer)
        job.leave()
        return 0
    task = model.config.problem_type or "single_label_classification"
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    if args.calibrate and task == "regression":
        raise CliError("--calibrate applies to classification; this model is a regression")
    table = job.main_first(lambda: read_table(args.data))

    def check():
        found = labelled(table, args, args.data)
        if found != task:
            raise CliError(f"{args.data}: labels are {found}, the model is {task}")
        check_known_labels(table, args.label_key, task, {n: i for i, n in enumerate(names)}, args.data)

    job.on_main(check)
    logits = sharded_logits(job, model, tokenizer, table, args)
    job.on_main(lambda: write_evaluation(args, model, table, logits, task, names))
    job.leave()
    return 0


def write_evaluation(args, model, table, logits, task, names) -> None:
    """Rank 0's part of evaluate: the metrics, the calibration folded into the model, the report and its plots."""
    targets = encode_labels(table[args.label_key], task, {n: i for i, n in enumerate(names)}, args.data)
    thresholds = getattr(model.config, "multi_label_thresholds", None)
    report = {"task": task, "labels": names, **metrics(logits, targets, task, names, thresholds)}
    if args.calibrate:
        calibrated, logits = calibrate_logits(model, logits, targets, task)
        thresholds = getattr(model.config, "multi_label_thresholds", None)
        report.update(metrics(logits, targets, task, names, thresholds))
        report["calibration"] = calibrated
        save_in_place(model, Path(args.model))
    write_report(args, report, partial(plot_report, report, task, names, logits, targets), render)


def render(report) -> str:
    """The report as a readable table."""
    lines = [f"{report['task']}, {report['examples']} examples"]
    for key in ("accuracy", "f1_macro", "f1_micro", "roc_auc", "ece", "mse", "mae", "pearson", "spearman"):
        if report.get(key) is not None:
            lines.append(f"  {key:10} {report[key]:.4f}")
    if "per_class" in report:
        lines.append(f"  {'label':20} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}")
        for name, row in report["per_class"].items():
            lines.append(
                f"  {name[:20]:20} {row['precision']:9.4f} {row['recall']:9.4f} {row['f1']:9.4f} {row['support']:8d}"
            )
    if report["task"] == "single_label_classification":
        lines.append("  confusion matrix (rows: true, columns: predicted)")
        lines += ["    " + " ".join(f"{n:6d}" for n in row) for row in report["confusion_matrix"]]
    return "\n".join(lines)


def result_rows(texts, probs, task, names, thresholds) -> list[dict]:
    """predict's output rows: the label and its probability, every label over its threshold, or the score."""
    results = []
    for text, row in zip(texts, probs.tolist(), strict=True):
        if task == "regression":
            results.append({"text": text, "score": row[0]})
        elif task == "single_label_classification":
            best = max(range(len(row)), key=row.__getitem__)
            results.append(
                {
                    "text": text,
                    "label": names[best],
                    "score": row[best],
                    "probabilities": dict(zip(names, row, strict=True)),
                }
            )
        else:
            chosen = [n for n, p, cut in zip(names, row, thresholds, strict=True) if p >= cut]
            results.append({"text": text, "labels": chosen, "probabilities": dict(zip(names, row, strict=True))})
    return results


class ResultWriter:
    """predict's rows into a .jsonl or .csv file, as they come (CSV: list columns joined by ';', one p_<label>
    column per label)."""

    def __init__(self, path: Path, kind: str, task: str, names: list, header: bool):
        import csv

        self.handle = open(path, "w", newline="")
        self.csv = None
        if kind == ".csv":
            columns = {"regression": ["text", "score"], "multi_label_classification": ["text", "labels"]}.get(
                task, ["text", "label", "score"]
            )
            columns += [f"p_{n}" for n in names] if task != "regression" else []
            self.csv = csv.DictWriter(self.handle, fieldnames=columns)
            if header:
                self.csv.writeheader()

    def write(self, rows: list[dict]) -> None:
        for r in rows:
            if self.csv is None:
                self.handle.write(json.dumps(r) + "\n")
            else:
                flat = {k: (";".join(v) if isinstance(v, list) else v) for k, v in r.items() if k != "probabilities"}
                self.csv.writerow({**flat, **{f"p_{n}": p for n, p in r.get("probabilities", {}).items()}})

    def close(self) -> None:
        self.handle.close()


def predict(args) -> int:
    """Scores the rows as they stream, each rank its contiguous shard into a part file; rank 0 joins the parts in rank
    order and moves the result onto --output only when it is complete (an --overwrite never leaves half a file).
    A reward model: rewards.predict."""
    from . import rewards
    from .rewards import is_reward_model

    job = Job()
    output = Path(args.output)

    def check_output():
        if output.suffix not in (".jsonl", ".csv"):
            raise CliError(f"--output {output}: use a .jsonl or .csv file")
        if output.exists() and not args.overwrite:
            raise CliError(f"--output {output} exists; pass --overwrite or another file")

    job.on_main(check_output)
    if args.engine == "vllm" and job.world > 1:
        raise CliError("--engine vllm runs as one process: pass --data-parallel-size / --tensor-parallel-size instead")
    if args.engine == "vllm":
        from . import vllm_scoring

        config, tokenizer = classifier_config(args.model), load_tokenizer(args.model)
    else:
        model, tokenizer = load_classifier(args.model, job.device)
        config = model.config
    if is_reward_model(config):
        if job.is_main:
            output.parent.mkdir(parents=True, exist_ok=True)
        llm = None
        if args.engine == "vllm":
            llm = vllm_scoring.load_engine(
                args.model,
                args.tensor_parallel_size,
                args.data_parallel_size,
                args.vllm_dtype,
                args.gpu_memory_utilization,
            )
        rewards.predict(args, job, None if llm else model, tokenizer, llm)
        job.leave()
        return 0
    if args.group_key:
        raise CliError("--group-key ranks the responses of a reward model; this model is a classifier")
    task = config.problem_type or "single_label_classification"
    names = [config.id2label[i] for i in range(config.num_labels)]
    thresholds = getattr(config, "multi_label_thresholds", None) or [0.5] * len(names)
    table = job.main_first(lambda: read_table(args.data))
    job.on_main(lambda: check_texts(table, args, args.data))
    if job.is_main:
        output.parent.mkdir(parents=True, exist_ok=True)
    job.barrier()
    if args.engine == "vllm":
        llm = vllm_scoring.load_engine(
            args.model, args.tensor_parallel_size, args.data_parallel_size, args.vllm_dtype, args.gpu_memory_utilization
        )
        stream = vllm_scoring.stream_logits(llm, tokenizer, table, args.text_key, args.text_pair_key)
    else:
        stream = shard_stream(job, model, tokenizer, table, args)
    part = output.with_name(f"{output.name}.rank{job.rank}.part")
    writer = ResultWriter(part, output.suffix, task, names, header=job.is_main)
    try:
        for texts, logits in stream:
            writer.write(result_rows(texts, probabilities(logits, task), task, names, thresholds))
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        writer.close()
    job.barrier()
    if job.is_main:
        joined = output.with_name(f"{output.name}.part")
        with open(joined, "wb") as whole:
            for rank in range(job.world):
                piece = output.with_name(f"{output.name}.rank{rank}.part")
                with open(piece, "rb") as handle:
                    shutil.copyfileobj(handle, whole)
                piece.unlink()
        os.replace(joined, output)
    job.say(f"predict: {len(table)} rows -> {output}")
    job.leave()
    return 0
