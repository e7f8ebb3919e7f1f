"""Reading and checking labelled data for the commands: every input format into rows, texts present, one label
kind that decides the task, labels encoded against the model's label map, a seeded held-out split, tokenization.

Each problem is a `CliError` naming the file, the column and the first bad row, raised before anything is written.
"""

import importlib
import json
import math
import numbers
import random
from pathlib import Path

TASKS = ("single_label_classification", "multi_label_classification", "regression")


FORMATS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")


class CliError(Exception):
    """Bad input: printed as one line, exit code 2, nothing written."""


def read_rows(path) -> list[dict]:
    """Rows of a CSV / TSV / JSON lines / JSON / Parquet file (optionally .gz / .bz2) or a datasets.save_to_disk
    folder, as dicts of Python values (JSON keeps its types; a missing CSV cell is NaN)."""
    source = Path(path)
    if source.is_dir():
        if not any((source / name).exists() for name in ("state.json", "dataset_dict.json")):
            raise CliError(f"{path}: a folder, but not one written by datasets' save_to_disk")
        import datasets

        loaded = datasets.load_from_disk(str(source))
        if isinstance(loaded, datasets.DatasetDict):
            if len(loaded) != 1:
                raise CliError(f"{path}: holds splits {list(loaded)}; point at one split's folder")
            loaded = next(iter(loaded.values()))
        rows = loaded.to_list()
    else:
        if not source.is_file():
            raise CliError(f"{path}: no such file")
        if source.stat().st_size == 0:
            raise CliError(f"{path} is empty")
        suffixes = [s for s in source.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
        kind = suffixes[-1] if suffixes else ""
        if kind not in FORMATS:
            raise CliError(f"{path}: unknown format {kind or '(no suffix)'!r}; use one of {', '.join(FORMATS)}")
        import pandas

        try:
            if kind in (".csv", ".tsv"):
                rows = pandas.read_csv(source, sep="\t" if kind == ".tsv" else ",").to_dict("records")
            elif kind == ".parquet":
                rows = pandas.read_parquet(source).to_dict("records")
            else:
                rows = read_json_rows(source, kind)
        except (ValueError, UnicodeDecodeError, pandas.errors.ParserError) as error:
            if "No columns to parse" in str(error):
                raise CliError(f"{path} is empty") from None
            raise CliError(f"{path}: cannot be read as {kind[1:]}: {str(error).splitlines()[0]}") from None
    rows = [{k: plain(v) for k, v in row.items()} for row in rows]
    if not rows:
        raise CliError(f"{path} is empty (no rows)")
    return rows


def read_json_rows(source: Path, kind: str) -> list[dict]:
    import pandas

    opener = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}.get(source.suffix)
    handle = importlib.import_module(opener).open(source, "rt") if opener else open(source)
    with handle:
        text = handle.read()
    if not text.strip():
        raise CliError(f"{source} is empty")
    if kind == ".json" and text.lstrip()[0] in "[{":
        try:
            data = json.loads(text)
            return data if isinstance(data, list) else pandas.DataFrame(data).to_dict("records")
        except json.JSONDecodeError:
            pass  # JSON lines in a .json file
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise ValueError(f"line {error.doc[: error.pos].count(chr(10)) + 1}: {error.msg}") from None


def plain(value):
    """numpy scalars and arrays (pandas, datasets) as Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def column(rows, key, path, flag):
    if key not in rows[0] and not any(key in row for row in rows):
        raise CliError(f"{path}: no column {key!r} (columns: {', '.join(map(str, rows[0]))}); pass {flag}")
    return [row.get(key) for row in rows]


def texts_of(rows, args, path):
    """(texts, pairs or None) with every text present."""
    texts = column(rows, args.text_key, path, "--text-key")
    pairs = column(rows, args.text_pair_key, path, "--text-pair-key") if args.text_pair_key else None
    for name, values in (("text", texts), ("text pair", pairs)):
        if values is None:
            continue
        bad = [i for i, v in enumerate(values) if is_missing(v) or not str(v).strip()]
        if bad:
            side = f" ({args.text_pair_key!r} missing where {args.text_key!r} is given)" if name == "text pair" else ""
            raise CliError(
                f"{path}: {name} missing or empty in {len(bad)} row(s){side}, first at row {bad[0] + 1}; "
                "fill or drop those rows"
            )
    return [str(t) for t in texts], None if pairs is None else [str(p) for p in pairs]


def label_task(labels, key, path) -> str:
    """Strings or integers: single-label; lists: multi-label; floats: regression. Refuses NaN and mixed kinds."""
    missing = [i for i, v in enumerate(labels) if is_missing(v)]
    if missing:
        raise CliError(
            f"{path}: label {key!r} is missing or NaN in {len(missing)} row(s), first at row {missing[0] + 1}; "
            "fill or drop those rows"
        )
    kinds = set()
    for value in labels:
        if isinstance(value, (list, tuple)):
            kinds.add("lists (multi-label)")
        elif isinstance(value, str):
            kinds.add("strings (single-label)")
        elif isinstance(value, numbers.Integral):  # bool included
            kinds.add("integers (single-label)")
        elif isinstance(value, numbers.Real):
            kinds.add("floats (regression)")
        else:
            kinds.add(type(value).__name__)
    if len(kinds) != 1:
        raise CliError(f"{path}: label {key!r} mixes kinds: {', '.join(sorted(kinds))}; make them one kind")
    kind = kinds.pop()
    if kind.startswith("lists"):
        return "multi_label_classification"
    if kind.startswith("floats"):
        return "regression"
    if "single-label" in kind:
        return "single_label_classification"
    raise CliError(f"{path}: label {key!r} holds {kind} values; use strings, integers, lists of them, or floats")


def labelled(rows, args, path):
    """(texts, pairs or None, labels, task) of a labelled file, checked once: every text there, one label kind."""
    texts, pairs = texts_of(rows, args, path)
    labels = column(rows, args.label_key, path, "--label-key")
    return texts, pairs, labels, label_task(labels, args.label_key, path)


def label_names(labels, task) -> list[str]:
    """The label map, sorted (numerically for integers): id i is names[i]."""
    values = {v for label in labels for v in (label if task == "multi_label_classification" else [label])}
    return [str(v) for v in sorted(values, key=lambda v: (isinstance(v, str), v))]


def encode_labels(labels, task, label2id, path):
    if task == "regression":
        return [float(v) for v in labels]
    unseen = sorted(
        {str(v) for label in labels for v in (label if isinstance(label, list) else [label])} - set(label2id)
    )
    if unseen:
        raise CliError(
            f"{path}: labels {unseen[:5]} are not among the model's labels {list(label2id)[:10]} "
            "(every label must occur in the training data)"
        )
    if task == "single_label_classification":
        return [label2id[str(v)] for v in labels]
    return [[1.0 if name in {str(v) for v in label} else 0.0 for name in label2id] for label in labels]


def split_eval(columns, fraction, seed):
    """(train columns, eval columns): a seeded random `fraction` of the rows held out, each column split alike."""
    if not 0 < fraction < 1:
        raise CliError(f"--eval-fraction {fraction} must be between 0 and 1")
    rows = len(columns[0])
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    count = max(1, round(rows * fraction))
    if count >= rows:
        raise CliError(f"--train has {rows} row(s): too few to hold out an eval set; pass --eval FILE")

    def pick(indices):
        return [None if values is None else [values[i] for i in indices] for values in columns]

    return pick(order[count:]), pick(order[:count])


def tokenize(tokenizer, texts, pairs, max_length=None):
    kwargs = {"truncation": True} if max_length is None else {"truncation": True, "max_length": max_length}
    encoded = tokenizer(texts, pairs, **kwargs) if pairs is not None else tokenizer(texts, **kwargs)
    return encoded["input_ids"]

