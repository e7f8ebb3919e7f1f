"""`python -m stable_models doctor --model DIR`: explain why a sequence-classification run gives NaN or nonsense.

Loads the tokenizer and the model from a local folder, builds padded batches, runs forward and backward with the
stock class and the Stable class side by side, and prints what is wrong and what to change. Exit code 0 when the
Stable class is healthy on this checkpoint and data, 1 otherwise.
"""

import os
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from ..modeling_precision import low_precision_trainables
from ..numerics import check_numerics
from ..registry import stable_class_for
from .arguments import doctor_parser
from .errors import CliError, report

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SENTENCES = [
    "A gripping, beautifully shot film.",
    "Dull.",
    "The plot makes no sense and the dialogue is worse, but the lead actor is charming enough to carry it.",
    "I laughed, I cried, I bought the soundtrack.",
    "Two hours I will never get back.",
    "An uneven but ultimately rewarding debut from a director to watch.",
    "Not bad.",
    "Visually stunning yet emotionally hollow, it never earns its grand finale.",
]


class Report:
    def __init__(self):
        self.lines, self.problems = [], 0

    def ok(self, text):
        self.lines.append(f"  ok    {text}")

    def warn(self, text, fix):
        self.lines.append(f"  WARN  {text}\n        -> {fix}")

    def fail(self, text, fix):
        self.problems += 1
        self.lines.append(f"  FAIL  {text}\n        -> {fix}")


def progress(text):
    print(f"[doctor] {text}", file=sys.stderr, flush=True)


def load_texts(path, text_key="text", label_key="label"):
    """(texts, labels or None) from a data file in any format train reads; labels may be ints or strings (mapped to
    ids in sorted order). Without a file: SENTENCES."""
    if path is None:
        return SENTENCES, None
    from .data import read_table, refuse_missing, require_column

    table = read_table(path)
    require_column(table, text_key, path, "--text-key")  # empty texts are left out with a warning (drop_empty_texts)
    labels = None
    if label_key in table.column_names:
        refuse_missing(table, label_key, path, "label")
        labels = list(table[label_key])
    return ["" if t is None else str(t) for t in table[text_key]], labels


def label_ids(labels, report):
    """Class ids for the labels: integers as they are, anything else mapped in sorted order (and the map shown)."""
    if labels is None:
        return None
    if all(isinstance(label, int) and not isinstance(label, bool) for label in labels):
        return labels
    names = sorted({str(label) for label in labels})
    mapping = {name: i for i, name in enumerate(names)}
    report.ok("labels mapped to ids: " + ", ".join(f"{name!r} -> {i}" for name, i in mapping.items()))
    return [mapping[str(label)] for label in labels]


def drop_empty_texts(texts, labels, tokenizer, report):
    """Leave out texts with no token of their own (empty, or only characters the tokenizer drops)."""
    empty = [i for i, t in enumerate(texts) if not t.strip() or not tokenizer(t, add_special_tokens=False).input_ids]
    if not empty:
        return texts, labels
    report.warn(
        f"{len(empty)} text(s) are empty or tokenize to nothing (data lines {[i + 1 for i in empty][:10]}): left out",
        "drop them from the data; a Stable model raises a ValueError for a row with no tokens",
    )
    keep = [i for i in range(len(texts)) if i not in set(empty)]
    if not keep:
        raise CliError("every text is empty or tokenizes to nothing")
    return [texts[i] for i in keep], None if labels is None else [labels[i] for i in keep]


def cell(value) -> str:
    """A table cell: numbers keep their exponent (6e-08 stays 6e-08), dtypes lose their 'torch.' prefix."""
    if isinstance(value, bool) or value is None:
        text = str(value)
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, torch.dtype):
        text = str(value).removeprefix("torch.")
    else:
        text = str(value)
    return text if len(text) <= 16 else text[:15] + "…"


def check_pad_token(tokenizer, config, report):
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is None:
        report.warn(
            "the tokenizer has no pad token: batches cannot be padded",
            "stable_models.setup_pad_token(tokenizer, model)",
        )
    elif pad == eos:
        report.warn(
            f"pad == eos ({tokenizer.pad_token!r}): the stock class skips a trailing eos and pools the token before it",
            "use a Stable class (pooling reads attention_mask), or setup_pad_token(tokenizer, model)",
        )
    else:
        report.ok(f"pad token {tokenizer.pad_token!r} (id {pad}), distinct from eos")
    if config.pad_token_id is None:
        report.warn(
            "config.pad_token_id is None: the stock class refuses batches > 1",
            "setup_pad_token(tokenizer, model) sets it; Stable classes do not need it",
        )
    elif pad is not None and config.pad_token_id != pad:
        report.warn(
            f"config.pad_token_id = {config.pad_token_id} but the tokenizer pads with {pad}",
            "setup_pad_token(tokenizer, model)",
        )


def report_code_files(folder, report) -> None:
    """What `stable-models verify` says about the folder's code files (what trust_remote_code=True would run)."""
    from ..verify import verify_folder

    verdict = verify_folder(folder)
    if verdict.ok:
        report.ok(verdict.lines()[-1])
    else:
        report.warn(
            f"code files: {'; '.join(verdict.problems)}",
            "do not load it with trust_remote_code=True; stable_models.from_pretrained runs no code from the folder "
            f"(`stable-models verify {folder}` lists every file)",
        )


def run_one(model, batch, alone_inputs, labels):
    """The numerics check (stable_models.numerics): the padded batch against each row alone; a dict of
    measurements for the table."""
    found = check_numerics(model, batch, labels, [(inputs, labels[i : i + 1]) for i, inputs in enumerate(alone_inputs)])
    return {
        "finite": found.finite,
        "loss": found.loss,
        "loss dtype": found.loss_dtype,
        "padding error": found.padding_error,
        "padding tolerance": found.padding_tolerance(model.dtype),
        "honours num_items_in_batch": found.honours_num_items,
        "first non-finite": found.first_non_finite,
        "problems": found.problems(model.dtype),
        "non-finite weights": [n for n, p in model.named_parameters() if not torch.isfinite(p).all()],
    }


def diagnose(args) -> int:
    """The checkpoint's checks, the stock class beside the Stable one, as a table and findings; exit 1 on a problem."""
    report = Report()
    start = time.perf_counter()
    if not os.path.isdir(args.model) or not os.path.isfile(os.path.join(args.model, "config.json")):
        raise CliError(f"--model {args.model}: not a folder with a config.json (a local checkpoint is needed)")
    config, pad_id, batch, alone_inputs, labels = doctor_inputs(args, report)
    results = run_both(args, config, pad_id, batch, alone_inputs, labels)
    judge(results, args, report)
    print(f"stable_models doctor: {args.model} ({config.model_type}), {time.perf_counter() - start:.0f}s")
    print("\n".join(comparison_table(results)))
    print("\n".join(report.lines))
    verdict = "healthy" if report.problems == 0 else f"{report.problems} problem(s)"
    print(f"Stable class: {verdict}")
    return 0 if report.problems == 0 else 1


def doctor_inputs(args, report):
    """(config, the pad id, a padded batch, each row alone, labels) from the folder and the data, with what they
    show reported: the code files, the pad token, the label map, empty texts."""
    texts, labels = load_texts(args.data, args.text_key, args.label_key)
    progress(f"loading tokenizer and config from {args.model}")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = AutoConfig.from_pretrained(args.model)
    report_code_files(args.model, report)
    if args.padding_side:
        tokenizer.padding_side = args.padding_side
    check_pad_token(tokenizer, config, report)
    labels = label_ids(labels, report)
    texts, labels = drop_empty_texts(texts, labels, tokenizer, report)
    texts = texts[: args.max_examples]
    if labels is None:
        report.ok("no labels in the data: made-up labels 0, 1, 0, 1, ... (only the numerics are checked)")
    labels = torch.tensor(labels[: len(texts)] if labels else [i % 2 for i in range(len(texts))])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # only to build the batch; reported above
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    alone_inputs = [dict(tokenizer([t], return_tensors="pt")) for t in texts]
    lengths = batch["attention_mask"].sum(-1).tolist()
    report.ok(
        f"{len(texts)} texts, lengths {min(lengths)}-{max(lengths)}, padding {tokenizer.padding_side}, "
        f"dtype {args.dtype}"
    )
    return config, tokenizer.pad_token_id, batch, alone_inputs, labels


def run_both(args, config, pad_id, batch, alone_inputs, labels) -> dict:
    """The numerics check of the stock class and of the Stable class (with the stock class's head), by name."""
    dtype = DTYPES[args.dtype]
    num_labels = max(2, int(labels.max()) + 1)
    results = {}
    stable_class = stable_class_for(config.model_type)
    for name in ("stock", "Stable"):
        progress(f"{name}: loading and running forward + backward")
        torch.manual_seed(0)
        kwargs = dict(num_labels=num_labels, dtype=dtype)
        if name == "Stable":
            model = stable_class.from_pretrained(args.model, **kwargs)
            if "stock" in results:
                model.score.weight.data.copy_(results["stock"]["score"])
        else:
            model = AutoModelForSequenceClassification.from_pretrained(args.model, **kwargs)
            if model.config.pad_token_id is None and pad_id is not None:
                model.config.pad_token_id = pad_id  # so the stock class runs at all
        low_precision = low_precision_trainables(model)
        try:
            results[name] = run_one(model, batch, alone_inputs, labels)
        except Exception as error:  # report, do not crash: the stock class may raise where Stable does not
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        results[name]["score"] = model.score.weight.detach().float().clone()
        results[name]["low precision"] = low_precision
        del model
    return results


def comparison_table(results: dict) -> list[str]:
    """The measurements side by side: a row per check, a column per class."""
    table = [f"  {'':28} {'stock':>16} {'Stable':>16}"]
    for key in ("finite", "loss", "loss dtype", "padding error", "honours num_items_in_batch", "first non-finite"):
        cells = [cell(results[n][key]) if key in results[n] else "error" for n in ("stock", "Stable")]
        table.append(f"  {key:28} {cells[0]:>16} {cells[1]:>16}")
    return table


def judge(results: dict, args, report) -> None:
    """The findings: a FAIL for each contract point the Stable class misses, a WARN for what the stock class gets
    wrong."""
    dtype = DTYPES[args.dtype]
    stock, stable = results["stock"], results["Stable"]
    if "error" in stock:
        report.warn(f"the stock class failed: {stock['error']}", "use the Stable class")
    elif not stock["finite"]:
        report.warn(f"stock class: non-finite values, first at {stock['first non-finite']}", "use the Stable class")
    if "error" in stable:
        report.fail(f"the Stable class failed: {stable['error']}", "fix the input or checkpoint named above")
    elif not stable["finite"]:
        where = f"Stable: non-finite values, first at {stable['first non-finite']}"
        if stable["non-finite weights"]:
            report.fail(
                f"{where}; the checkpoint holds NaN/inf in {stable['non-finite weights'][:3]}",
                "restore the weights from an earlier checkpoint; train with stable_models.StopOnNonFinite",
            )
        else:
            report.fail(where, "load in bf16 instead" if dtype == torch.float16 else "check the data and the weights")
    else:
        report.ok("Stable: loss, logits and gradients are finite")
        if "padding" not in stable["problems"]:
            tolerance = stable["padding tolerance"]
            report.ok(f"Stable: padding changes logits by {stable['padding error']:.2e} (<= {tolerance:.1e})")
        for problem in stable["problems"].values():  # judged once, by stable_models.numerics
            report.fail(f"Stable: {problem}", "report this checkpoint: the Stable class's contract rules it out")
    if "error" not in stock and not stock["honours num_items_in_batch"]:
        report.warn(
            "stock class: the loss ignores num_items_in_batch, so Trainer with gradient_accumulation_steps=N "
            "gives N x larger updates and logged loss",
            "use the Stable class",
        )
    if "error" not in stock and stock["loss dtype"] != torch.float32:
        report.warn(
            f"stock class: loss computed in {stock['loss dtype']} (reads 0.0 once the model is confident)",
            "use the Stable class (fp32 head, logits and loss)",
        )
    if stable.get("low precision"):
        report.warn(
            f"{len(stable['low precision'])} trainable backbone parameters are {args.dtype} without fp32 "
            "master weights: small AdamW updates round away",
            "load in fp32 and train with bf16 autocast (TrainingArguments(bf16=True)), or use LoRA",
        )


def main(argv=None) -> int:
    """`python -m stable_models doctor ...` (the arguments are parsed by arguments.doctor_parser, before torch is
    imported); a bad input is the command line's one-line error, exit 2."""
    parser = doctor_parser()
    try:
        return run(parser, parser.parse_args(argv))
    except CliError as error:
        report(error)
        return 2


def run(parser, args) -> int:
    if (args.model is None) == (args.log is None):
        parser.error("give --model DIR (run a checkpoint) or --log FILE (explain a Trainer log)")
    if args.log:
        from .logs import explain_log

        return explain_log(args.log, args.num_labels)
    return diagnose(args)
