"""Classification data: a text (or text pair) and a label per row, read and checked at any size (Arrow batches) and
tokenized by a cached `map`. The label column's Arrow type decides the problem type: strings or integers are
single-label, lists multi-label, floats regression."""

import numbers

from ..labels import encode_labels, refuse_unseen
from .data import (
    arrow_batches,
    blank,
    cached_map,
    check_texts,
    cut_warning,
    first_true,
    not_finite,
    refuse_missing,
    require_column,
)
from .errors import CliError


def label_problem_type(table, key, path) -> str:
    """From the label column's Arrow type: strings or integers mean single-label, lists multi-label, floats
    regression. Refuses missing / NaN labels and a column that mixes kinds."""
    import pyarrow

    require_column(table, key, path, "--label-key")
    refuse_missing(table, key, path, "label")
    arrow_type = table.data.schema.field(key).type
    if pyarrow.types.is_list(arrow_type) or pyarrow.types.is_large_list(arrow_type):
        refuse_bad_labels(table, key, path, blank_in_lists, "missing or empty")
        return "multi_label_classification"
    if pyarrow.types.is_floating(arrow_type):
        refuse_bad_labels(table, key, path, not_finite, "not finite")
        return "regression"
    if pyarrow.types.is_string(arrow_type) or pyarrow.types.is_large_string(arrow_type):
        refuse_bad_labels(table, key, path, blank, "missing or empty")
    if any(
        test(arrow_type)
        for test in (
            pyarrow.types.is_string,
            pyarrow.types.is_large_string,
            pyarrow.types.is_integer,
            pyarrow.types.is_boolean,
        )
    ):
        return "single_label_classification"
    return refuse_label_kinds(table[key], key, path)  # e.g. datasets' Json feature: a JSON column of mixed kinds


def blank_in_lists(lists):
    """Per row: a list holding a missing, empty or whitespace-only label."""
    import numpy
    import pyarrow
    import pyarrow.compute as pc

    if isinstance(lists, pyarrow.ChunkedArray):
        lists = lists.combine_chunks()
    elements = pc.list_flatten(lists)
    bad = pc.is_null(elements, nan_is_null=True)
    if pyarrow.types.is_string(elements.type) or pyarrow.types.is_large_string(elements.type):
        bad = pc.or_(bad, blank(elements))
    rows = numpy.zeros(len(lists), dtype=bool)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    rows[parents[bad.to_numpy(zero_copy_only=False).astype(bool)]] = True
    return pyarrow.array(rows)


def refuse_bad_labels(table, key, path, test, what) -> None:
    """One line naming the first row whose label fails `test` (one vectorized pass)."""
    count, first = first_true(test(batch.column(key)) for batch in arrow_batches(table, [key]))
    if count:
        raise CliError(
            f"{path}: label {key!r} {what} in {count} row(s), first at row {first + 1}; fill or drop those rows"
        )


def refuse_label_kinds(labels, key, path) -> str:
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
    raise CliError(f"{path}: label {key!r} holds {kind} values; use strings, integers, lists of them, or floats")


def checked_problem_type(table, options, path) -> str:
    """The problem type of a labelled table, checked once: every text there, one label kind, no missing label."""
    check_texts(table, path, options.text_key, options.text_pair_key)
    return label_problem_type(table, options.label_key, path)


def label_values(table, key, problem_type) -> set:
    """The distinct label values (the elements of the lists, for multi-label), one Arrow pass."""
    import pyarrow.compute as pc

    values = set()
    for batch in arrow_batches(table, [key]):
        column = batch.column(key)
        if problem_type == "multi_label_classification":
            column = pc.list_flatten(column)
        values |= set(pc.unique(column).to_pylist())
    return values


def label_names(table, key, problem_type) -> list[str]:
    """The label map, sorted (numerically for integers): id i is names[i]."""
    values = label_values(table, key, problem_type)
    return [str(v) for v in sorted(values, key=lambda v: (isinstance(v, str), v))]


def check_known_labels(table, key, problem_type, label2id, path) -> None:
    if problem_type != "regression":
        try:
            refuse_unseen(label_values(table, key, problem_type), label2id, path)
        except ValueError as error:
            raise CliError(str(error)) from None


def texts_of(batch: dict, text_key, pair_key):
    texts = [str(t) for t in batch[text_key]]
    return texts, None if not pair_key else [str(p) for p in batch[pair_key]]


def tokenize(tokenizer, texts, pairs, max_length=None, truncate=True):
    if not truncate:
        kwargs = {"truncation": False, "verbose": False}  # no "longer than model_max_length" warning
    else:
        kwargs = {"truncation": True} if max_length is None else {"truncation": True, "max_length": max_length}
    encoded = tokenizer(texts, pairs, **kwargs) if pairs is not None else tokenizer(texts, **kwargs)
    return encoded["input_ids"]


def tokenize_cutting(tokenizer, texts, pairs, max_length=None) -> tuple[list, list[int]]:
    """Token ids truncated as the tokenizer truncates (it keeps its special tokens), and each row's full length where
    truncation cut it (0 elsewhere): what train's, evaluate's and predict's warnings count."""
    ids = tokenize(tokenizer, texts, pairs, truncate=False)
    limit = max_length or tokenizer.model_max_length
    long = [i for i, row in enumerate(ids) if len(row) > limit]
    cut_from = [0] * len(ids)
    if long:
        shortened = tokenize(tokenizer, [texts[i] for i in long], pairs and [pairs[i] for i in long], max_length)
        for i, row in zip(long, shortened, strict=True):
            cut_from[i], ids[i] = len(ids[i]), row
    return ids, cut_from


def encode_batch(batch, tokenizer, text_key, pair_key, label_key, problem_type, label2id, max_length):
    """One `map` batch: token ids, their count (for the evaluation cadence and the model's length limit), the
    encoded labels, and the full length of each row that truncation cut (0 where nothing was cut), for train's
    warning."""
    texts, pairs = texts_of(batch, text_key, pair_key)
    ids, cut_from = tokenize_cutting(tokenizer, texts, pairs, max_length)
    return {
        "input_ids": ids,
        "length": [len(i) for i in ids],
        "labels": encode_labels(batch[label_key], problem_type, label2id, "map"),
        "cut_from": cut_from,
    }


def cut_rows(table, path, flag_limit: int) -> str | None:
    """train's warning about rows that truncation cut (an `encoded` table), or None."""
    import pyarrow.compute as pc

    count, longest = 0, 0
    for batch in arrow_batches(table, ["cut_from"]):
        column = batch.column("cut_from")
        count += pc.sum(pc.greater(column, 0)).as_py() or 0
        longest = max(longest, pc.max(column).as_py() or 0)
    if not count:
        return None
    advice = "--max-length chooses the length, up to the model's positions"
    return cut_warning("train", path, count, longest, flag_limit, advice)


def encoded(table, tokenizer, options, problem_type, label2id, max_length):
    """The table as `input_ids`, `length` and `labels` columns (and `cut_from`, for train's warning)."""
    return cached_map(
        table,
        encode_batch,
        "tokenizing",
        tokenizer=tokenizer,
        text_key=options.text_key,
        pair_key=options.text_pair_key,
        label_key=options.label_key,
        problem_type=problem_type,
        label2id=label2id,
        max_length=max_length,
    )


def label_counts(table, key, names) -> list[int]:
    """How often each of `names` occurs in a single-label column (one Arrow pass)."""
    import pyarrow.compute as pc

    counts = dict.fromkeys(names, 0)
    for batch in arrow_batches(table, [key]):
        for entry in pc.value_counts(batch.column(key)).to_pylist():
            counts[str(entry["values"])] += entry["counts"]
    return [counts[name] for name in names]
