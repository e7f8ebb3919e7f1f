"""`stable-models train | evaluate | predict`: the commands, each a sequence of named steps over data.py (reading
and checking), calibration.py (metrics, temperature, thresholds) and plots.py. cli.py parses the arguments.
"""

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .calibration import calibrate_logits, forward_in_length_order, metrics, probabilities
from .data import CliError, encode_labels, label_names, labelled, read_rows, split_eval, texts_of, tokenize
from .plots import PLOTS_HINT, plot_report


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


def load_classifier(model: str):
    """A classifier folder saved by `train` (or any Stable / stock classifier folder), in fp32, eval mode."""
    import stable_models

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
        classifier = stable_models.from_pretrained(model, dtype=torch.float32)
    except (OSError, ValueError, TypeError) as error:
        raise CliError(f"--model {model}: {str(error).splitlines()[0]}") from None
    tokenizer = load_tokenizer(model)
    if tokenizer.pad_token_id is None:
        from .tokenization import setup_pad_token

        setup_pad_token(tokenizer)
    return classifier.eval(), tokenizer


def save_in_place(model, folder: Path) -> None:
    """Save next to `folder`, then swap the files in, so an interrupted save leaves the old checkpoint whole."""
    staging = folder / ".stable-models-saving"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    for item in staging.iterdir():
        if item.name != "README.md":
            os.replace(item, folder / item.name)
    shutil.rmtree(staging, ignore_errors=True)


def check_output_dir(output: Path, overwrite: bool, resume: bool) -> None:
    if output.exists() and not output.is_dir():
        raise CliError(f"--output {output} is a file; give a directory")
    if output.is_dir() and any(output.iterdir()) and not (overwrite or resume):
        raise CliError(f"--output {output} exists and is not empty; pass --overwrite, --resume, or another directory")


def decoder_layer_linears(model) -> list[str]:
    """The names LoRA targets: every linear layer inside the decoder layers (attention and MLP; GPT-2's Conv1D
    included), for any architecture."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.pytorch_utils import Conv1D

    names = set()
    for layer in (m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)):
        names |= {n.split(".")[-1] for n, m in layer.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    if not names:
        raise CliError(f"{type(model).__name__}: no linear layers in its decoder layers for LoRA; pass --full")
    return sorted(names)


def preflight(model, tokenizer, texts, pairs, labels, task, folder) -> None:
    """The doctor's checks on the first examples: finite loss and gradients, padding-invariant logits, an fp32 loss
    that honours num_items_in_batch. Stops with the doctor's report when one fails."""
    from .doctor import PADDING_TOLERANCE, run_one

    count = min(8, len(texts))
    ids = tokenize(tokenizer, texts[:count], pairs[:count] if pairs else None)
    batch = dict(tokenizer.pad({"input_ids": ids}, return_tensors="pt"))
    alone = [dict(tokenizer.pad({"input_ids": [one]}, return_tensors="pt")) for one in ids]
    dtype = torch.long if task == "single_label_classification" else torch.float32
    result = run_one(model, batch, alone, torch.tensor(labels[:count], dtype=dtype))
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
    """The training and eval rows of `train`, checked, with labels encoded against one label map."""

    texts: list
    pairs: list | None
    labels: list
    eval_texts: list
    eval_pairs: list | None
    eval_labels: list
    task: str
    names: list


def read_training_data(args) -> LabelledData:
    """--train (and --eval, or a held-out --eval-fraction of --train), checked: one label kind, at least two classes."""
    texts, pairs, raw_labels, task = labelled(read_rows(args.train), args, args.train)
    if args.eval:
        eval_texts, eval_pairs, eval_raw, eval_task = labelled(read_rows(args.eval), args, args.eval)
        if eval_task != task:
            raise CliError(f"the eval labels are {eval_task}, the training labels {task}; make them one kind")
    else:
        (texts, pairs, raw_labels), (eval_texts, eval_pairs, eval_raw) = split_eval(
            [texts, pairs, raw_labels], args.eval_fraction, args.seed
        )
    names = label_names(raw_labels, task) if task != "regression" else ["score"]
    label2id = {name: i for i, name in enumerate(names)}
    labels = encode_labels(raw_labels, task, label2id, args.train)
    eval_labels = encode_labels(eval_raw, task, label2id, args.eval or "the held-out rows")
    if task == "single_label_classification" and len(names) < 2:
        raise CliError(f"{args.train}: only one label ({names[0]!r}); a classifier needs at least two")
    return LabelledData(texts, pairs, labels, eval_texts, eval_pairs, eval_labels, task, names)


def loading_options(args, data: LabelledData) -> dict:
    """`from_pretrained` arguments for the classifier: the label map, the task, pooling and the loss options."""
    options = {}
    if args.class_weights:
        if data.task != "single_label_classification":
            raise CliError("--class-weights applies to single-label classification")
        options["class_weights"] = class_weights(args.class_weights, data.labels, data.names)
    if args.label_smoothing:
        options["label_smoothing"] = args.label_smoothing
    if args.pos_weight:
        if data.task != "multi_label_classification":
            raise CliError("--pos-weight applies to multi-label classification")
        options["pos_weight"] = parse_weights(args.pos_weight, "--pos-weight", len(data.names))
    load = dict(
        num_labels=len(data.names),
        id2label=dict(enumerate(data.names)),
        label2id={name: i for i, name in enumerate(data.names)},
        problem_type=data.task,
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


def load_base_model(args, load: dict, dtype: str):
    """The Stable classifier on --model: fp32, or 4-bit base weights with --qlora; a GGUF file dequantized."""
    import transformers

    import stable_models

    quantized = dict(load)
    if args.qlora:
        compute = torch.bfloat16 if dtype == "bf16" else torch.float32
        quantized["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
        )
        quantized["device_map"] = "auto" if torch.cuda.is_available() else "cpu"
    try:
        model = stable_models.from_pretrained(args.model, **quantized)
    except ValueError as error:
        raise CliError(f"--model {args.model}: {str(error).splitlines()[0]}") from None
    if args.gguf_file:  # dequantized on load: a plain fp32 model, saved without GGUF quantization settings
        model.hf_quantizer, model.is_quantized = None, False
        model.config.__dict__.pop("quantization_config", None)
    if args.qlora:
        keep_4bit_weights_trainable(model)
    return model


def keep_4bit_weights_trainable(model) -> None:
    """bitsandbytes (0.50) on CPUs with AVX512-BF16 repacks a 4-bit layer's weights for inference at its first no-grad
    forward (Trainer's evaluation) and keeps them so; the next training step then fails in that inference kernel
    ("a view of a leaf Variable ... in-place"). Training keeps the training layout: this model's layers skip it."""
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def tokenized_sets(args, tokenizer, model, data: LabelledData) -> tuple[list, list]:
    """(train, eval) examples of token ids and labels, truncated to --max-length and the model's positions; the
    tokenizer remembers the longest, so evaluate and predict truncate where training did."""
    limit = min(args.max_length or 10**9, getattr(model.config.get_text_config(), "max_position_embeddings", 10**9))
    ids = tokenize(tokenizer, data.texts, data.pairs, limit)
    eval_ids = tokenize(tokenizer, data.eval_texts, data.eval_pairs, limit)
    tokenizer.model_max_length = max(len(i) for i in ids + eval_ids)
    train_set = [{"input_ids": i, "labels": y} for i, y in zip(ids, data.labels, strict=True)]
    eval_set = [{"input_ids": i, "labels": y} for i, y in zip(eval_ids, data.eval_labels, strict=True)]
    return train_set, eval_set


def with_adapters(model, args):
    """LoRA on every linear layer of the decoder layers (after k-bit preparation with --qlora); --full: unchanged."""
    if args.full:
        return model
    from peft import LoraConfig, get_peft_model

    if args.qlora:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    targets = [name.strip() for name in args.lora_target.split(",")] if args.lora_target else None
    lora = LoraConfig(
        task_type="SEQ_CLS",
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=args.lora_dropout,
        target_modules=targets or decoder_layer_linears(model),
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as error:  # peft names the targets it did not find
        raise CliError(f"--lora-target {args.lora_target}: {str(error).splitlines()[0]}") from None


def make_trainer(args, model, tokenizer, data: LabelledData, train_set, eval_set, dtype: str, checkpoints: Path):
    """StableTrainer with packing (padding for recurrent models or --no-packing), evaluation and checkpoints five
    times per run, the best checkpoint restored at the end, StopOnNonFinite and early stopping."""
    from transformers import DataCollatorWithPadding, EarlyStoppingCallback, TrainingArguments

    import stable_models

    from .modeling_rules import recurrent_layer_kinds
    from .trainer import StableTrainer
    from .training import StopOnNonFinite

    collator = (
        DataCollatorWithPadding(tokenizer)
        if recurrent_layer_kinds(model.config) or args.no_packing
        else stable_models.PackedCollator(pad_token_id=tokenizer.pad_token_id)
    )
    steps_per_epoch = math.ceil(len(train_set) / (args.batch_size * args.grad_accum))
    total_steps = args.max_steps or math.ceil(steps_per_epoch * args.epochs)
    eval_steps = args.eval_steps or max(1, total_steps // 5)
    training = TrainingArguments(
        output_dir=str(checkpoints),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=2 * args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr or (2e-5 if args.full else 2e-4),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        warmup_steps=int(total_steps * args.warmup_ratio) or (1 if args.warmup_ratio else 0),
        lr_scheduler_type=args.scheduler,
        weight_decay=args.weight_decay,
        gradient_checkpointing=args.gradient_checkpointing,
        # reentrant checkpointing (transformers 4.x's default) passes no gradient to LoRA: its inputs need none
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.gradient_checkpointing else None,
        eval_strategy="steps",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=eval_steps,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="mse" if data.task == "regression" else "f1_macro",
        greater_is_better=data.task != "regression",
        logging_steps=max(1, min(eval_steps, total_steps // 20)),
        seed=args.seed,
        bf16=dtype == "bf16",
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        remove_unused_columns=False,
        label_names=["labels"],
        disable_tqdm=False,
    )
    callbacks = [StopOnNonFinite()]
    if args.early_stopping:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=args.early_stopping))

    def compute_metrics(prediction):
        report = metrics(torch.as_tensor(prediction.predictions), prediction.label_ids, data.task, data.names)
        return {k: v for k, v in report.items() if isinstance(v, float)}

    return StableTrainer(
        model=model,
        args=training,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=collator,
        compute_metrics=compute_metrics,
        callbacks=callbacks,
    )


def merged_model(model, args, load: dict, tokenizer, checkpoints: Path):
    """The trained model as one plain checkpoint: LoRA merged into the base; with --qlora merged into the
    full-precision base, not into 4-bit weights."""
    if args.qlora:
        from peft import PeftModel

        import stable_models

        model.save_pretrained(checkpoints / "adapter")
        base = stable_models.from_pretrained(args.model, **load)
        if len(tokenizer) > base.get_input_embeddings().num_embeddings:  # setup_pad_token added a pad row
            base.resize_token_embeddings(len(tokenizer))  # (peft saved the resized embeddings with the adapter)
        base.config.pad_token_id = tokenizer.pad_token_id
        model = PeftModel.from_pretrained(base, checkpoints / "adapter")
    return model if args.full else model.merge_and_unload()


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

    output = Path(args.output)
    check_output_dir(output, args.overwrite, args.resume)
    if args.full and args.qlora:
        raise CliError("--full and --qlora exclude each other")
    check_model_path(args.model, args.gguf_file)
    data = read_training_data(args)
    transformers.set_seed(args.seed)
    dtype = fast_dtype() if args.dtype == "auto" else args.dtype
    load = loading_options(args, data)
    tokenizer = load_tokenizer(args.model, args.gguf_file)
    kind = data.task.replace("_", " ")
    print(f"[train] loading {args.model} as a {kind} model with {len(data.names)} output(s)", file=sys.stderr)
    model = load_base_model(args, load, dtype)
    setup_pad_token(tokenizer, model)
    train_set, eval_set = tokenized_sets(args, tokenizer, model, data)
    print(
        f"[train] {len(train_set)} train / {len(eval_set)} eval examples, max length {tokenizer.model_max_length}, "
        f"{dtype}",
        file=sys.stderr,
    )
    preflight(model, tokenizer, data.texts, data.pairs, data.labels, data.task, args.model)
    model = with_adapters(model, args)
    checkpoints = output / "checkpoints"
    trainer = make_trainer(args, model, tokenizer, data, train_set, eval_set, dtype, checkpoints)
    resume = args.resume and any(checkpoints.glob("checkpoint-*"))
    if args.resume and not resume:
        print(f"[train] --resume: no checkpoint in {checkpoints}, starting from step 0", file=sys.stderr)
    trainer.train(resume_from_checkpoint=True if resume else None)
    history = list(trainer.state.log_history)
    final = trainer.evaluate()  # the best checkpoint's, which load_best_model_at_end restored
    model = merged_model(trainer.model, args, load, tokenizer, checkpoints)
    summary = write_training_outputs(model, tokenizer, output, history, final)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k in ("accuracy", "f1_macro", "mse", "loss", "ece"))
    print(f"[train] done: {shown}")
    print(f"[train] model: {output} (AutoModelForSequenceClassification.from_pretrained(dir, trust_remote_code=True))")
    print(f"[train] next: stable-models evaluate --model {output} --data <test file> --calibrate")
    print(f"[train] serve: python -m vllm.entrypoints.openai.api_server --model {output} --runner pooling")
    return 0


def parse_weights(text: str, flag: str, count: int) -> list[float]:
    try:
        weights = [float(w) for w in str(text).split(",")]
    except ValueError:
        raise CliError(f"{flag} {text!r}: give {count} comma-separated numbers, in label order") from None
    if len(weights) != count or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise CliError(f"{flag} {text!r}: give {count} finite, non-negative numbers, in label order")
    return weights


def class_weights(value: str, labels, names) -> list[float]:
    """`balanced` (n / (classes x count), as scikit-learn) or one weight per label."""
    if value != "balanced":
        return parse_weights(value, "--class-weights", len(names))
    counts = [labels.count(i) for i in range(len(names))]
    return [len(labels) / (len(names) * c) if c else 0.0 for c in counts]


def evaluate(args) -> int:
    model, tokenizer = load_classifier(args.model)
    task = model.config.problem_type or "single_label_classification"
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    texts, pairs, raw, found = labelled(read_rows(args.data), args, args.data)
    if found != task:
        raise CliError(f"{args.data}: labels are {found}, the model is {task}")
    targets = encode_labels(raw, task, {n: i for i, n in enumerate(names)}, args.data)
    report_dir = Path(args.report_dir or Path(args.model) / "evaluation")
    logits = forward_in_length_order(model, tokenizer, texts, pairs, args.batch_size)
    thresholds = getattr(model.config, "multi_label_thresholds", None)
    report = {"task": task, "labels": names, **metrics(logits, targets, task, names, thresholds)}
    if args.calibrate:
        if task == "regression":
            raise CliError("--calibrate applies to classification; this model is a regression")
        calibrated, logits = calibrate_logits(model, logits, targets, task)
        thresholds = getattr(model.config, "multi_label_thresholds", None)
        report.update(metrics(logits, targets, task, names, thresholds))
        report["calibration"] = calibrated
        save_in_place(model, Path(args.model))
    report_dir.mkdir(parents=True, exist_ok=True)
    log = Path(args.model) / "training_log.json"
    training_log = json.loads(log.read_text()) if log.is_file() else None
    report["plots"] = plot_report(report, task, names, logits, targets, report_dir, training_log)
    (report_dir / "report.json").write_text(json.dumps(report, indent=1))
    print(render(report))
    if args.calibrate:
        c = report["calibration"]
        print(
            f"calibrated: temperature {c['temperature']:.3f} folded into {args.model} (NLL {c['nll_before']:.4f} -> "
            f"{c['nll_after']:.4f}, ECE {c['ece_before']:.4f} -> {c['ece_after']:.4f})"
        )
    print(f"report: {report_dir / 'report.json'}" + ("" if report["plots"] else f" (no plots: {PLOTS_HINT})"))
    return 0


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


def predict(args) -> int:
    output = Path(args.output)
    if output.suffix not in (".jsonl", ".csv"):
        raise CliError(f"--output {output}: use a .jsonl or .csv file")
    if output.exists() and not args.overwrite:
        raise CliError(f"--output {output} exists; pass --overwrite or another file")
    model, tokenizer = load_classifier(args.model)
    task = model.config.problem_type or "single_label_classification"
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    rows = read_rows(args.data)
    texts, pairs = texts_of(rows, args, args.data)
    logits = forward_in_length_order(model, tokenizer, texts, pairs, args.batch_size)
    probs = probabilities(logits, task)
    thresholds = getattr(model.config, "multi_label_thresholds", None) or [0.5] * len(names)
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
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".jsonl":
        output.write_text("".join(json.dumps(r) + "\n" for r in results))
    else:
        import pandas

        flat = [
            {
                **{k: (";".join(v) if isinstance(v, list) else v) for k, v in r.items() if k != "probabilities"},
                **{f"p_{n}": p for n, p in r.get("probabilities", {}).items()},
            }
            for r in results
        ]
        pandas.DataFrame(flat).to_csv(output, index=False)
    print(f"predict: {len(results)} rows -> {output}")
    return 0

