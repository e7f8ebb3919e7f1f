"""Reading and checking data for the commands, every task alike, at any size: every input format goes into a
`datasets` Arrow table (cached on disk, memory-mapped), the checks run over Arrow batches, tokenization is a cached
`map` with workers, and scoring streams the rows in order. Memory stays flat in the number of rows.

Each problem is a `CliError` naming the file, the column and the first bad row, raised before anything is written.
What a task's rows mean is read in its own module: classification_data.py, preference_data.py, ranking_data.py.
"""

import contextlib
import os
import sys
from pathlib import Path

from .errors import CliError

FORMATS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
CHECK_BATCH = 65_536  # rows per Arrow batch in the checks: vectorized, and flat in memory
MAP_BATCH = 1_000  # rows per tokenizer call in `map`
ROWS_PER_WORKER = 50_000  # below this a worker process costs more than it saves


def read_table(path, encoding=None):
    """A CSV / TSV / JSON lines / JSON / Parquet file (optionally .gz / .bz2 / .xz / .zst) or a datasets.save_to_disk
    folder as a `datasets.Dataset`: converted to Arrow once, cached by datasets, memory-mapped after that. Text files
    are read as UTF-8 unless `encoding` (--encoding) says otherwise."""
    import datasets

    source = Path(path)
    if source.is_dir():
        if not any((source / name).exists() for name in ("state.json", "dataset_dict.json")):
            raise CliError(f"{path}: a folder, but not one written by datasets' save_to_disk")
        table = datasets.load_from_disk(str(source))
        if isinstance(table, datasets.DatasetDict):
            if len(table) != 1:
                raise CliError(f"{path}: holds splits {list(table)}; point at one split's folder")
            table = next(iter(table.values()))
    else:
        if not source.is_file():
            raise CliError(f"{path}: no such file")
        if source.stat().st_size == 0:
            raise CliError(f"{path} is empty")
        suffixes = [s for s in source.suffixes if s not in COMPRESSIONS]
        kind = suffixes[-1] if suffixes else ""
        if kind not in FORMATS:
            raise CliError(f"{path}: unknown format {kind or '(no suffix)'!r}; use one of {', '.join(FORMATS)}")
        builder, options = {".csv": ("csv", {}), ".tsv": ("csv", {"sep": "\t"}), ".parquet": ("parquet", {})}.get(
            kind, ("json", {})
        )
        if encoding and builder != "parquet":
            options["encoding"] = encoding
        try:
            with no_progress_bars():  # one line per file read is noise in a command's output
                table = datasets.load_dataset(builder, data_files=str(source.resolve()), split="train", **options)
        except Exception as error:  # datasets wraps the reader's error (pandas, pyarrow, json) in its own
            cause = error.__cause__ or error
            message = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
            if "No columns to parse" in message or "Empty" in message:
                raise CliError(f"{path} is empty") from None
            if builder != "parquet":
                where = first_unreadable_line(source, encoding, kind == ".jsonl")
                if where:
                    raise CliError(f"{path}: {where}") from None
            raise CliError(f"{path}: cannot be read as {kind[1:]}: {message}") from None
        if builder == "json":  # pandas' CSV reader refuses such bytes itself
            refuse_invalid_text(table, source, path, encoding, kind == ".jsonl")
        if kind == ".json":
            table = columns_layout(table)
    if len(table) == 0:
        raise CliError(f"{path} is empty (no rows)")
    return table


def refuse_invalid_text(table, source: Path, path, encoding, json_lines: bool) -> None:
    """pyarrow's JSON reader keeps bytes that are not UTF-8 inside strings (they fail later, as a traceback): a full
    validation of the Arrow table (C++, one pass) finds them, and the file's line is then named."""
    try:
        table.data.table.validate(full=True)
    except Exception:
        where = first_unreadable_line(source, encoding, json_lines)
        raise CliError(f"{path}: {where or 'holds text that is not valid UTF-8'}") from None


OPENERS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}  # the compressions Python reads by itself


def first_unreadable_line(source: Path, encoding, json_lines: bool) -> str | None:
    """Why a text file failed to load, by line, when it is a line's fault: bytes that are not `encoding` (UTF-8 by
    default), or (JSON lines) a line that is not JSON. None when no line is to blame, or for .zst files."""
    import importlib
    import json

    if source.suffix == ".zst":
        return None
    opener = importlib.import_module(OPENERS[source.suffix]).open if source.suffix in OPENERS else open
    offset = 0
    with opener(source, "rb") as lines:
        for number, line in enumerate(lines, 1):
            try:
                text = line.decode(encoding or "utf-8")
            except UnicodeDecodeError as error:
                return (
                    f"not {encoding or 'UTF-8'} text: line {number} (byte {offset + error.start}) holds "
                    f"{line[error.start : error.start + 1]!r}; re-save the file as UTF-8, or pass its encoding "
                    "(--encoding latin-1, cp1252, ...)"
                )
            if json_lines and text.strip():
                try:
                    json.loads(text)
                except json.JSONDecodeError as error:
                    return f"line {number} is not JSON ({error.msg}, column {error.colno}); fix or remove that line"
            offset += len(line)
    return None


@contextlib.contextmanager
def no_progress_bars():
    """datasets' progress bars and its logger off for a step that only reads or checks: bad input then prints one
    line (ours), not datasets' own report of the same error before it."""
    import logging

    import datasets

    enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)
        if enabled:
            datasets.enable_progress_bars()


def columns_layout(table):
    """A JSON file holding one object of equal-length columns ({"text": [...], "label": [...]}, pandas' `columns`
    layout) as rows; datasets reads it as a single row of lists."""
    import datasets

    lists = tuple(getattr(datasets, name) for name in ("List", "Sequence") if hasattr(datasets, name))
    if len(table) != 1 or not all(isinstance(f, lists) for f in table.features.values()):
        return table
    row = table[0]
    if len({len(v) for v in row.values()}) != 1:
        return table
    return datasets.Dataset.from_dict(row)


def arrow_batches(table, columns):
    """The table's `columns` as pyarrow tables of CHECK_BATCH rows, in row order (indices mappings honoured)."""
    yield from table.select_columns(columns).with_format("arrow").iter(batch_size=CHECK_BATCH)


def first_true(masks) -> tuple[int, int | None]:
    """(how many rows are True, the first one's index) over a sequence of boolean arrays, one per batch."""
    import numpy

    count, first, offset = 0, None, 0
    for mask in masks:
        flags = numpy.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)
        hits = numpy.flatnonzero(flags)
        if len(hits) and first is None:
            first = offset + int(hits[0])
        count += len(hits)
        offset += len(flags)
    return count, first


def require_column(table, key, path, flag) -> None:
    if key not in table.column_names:
        raise CliError(f"{path}: no column {key!r} (columns: {', '.join(table.column_names)}); pass {flag}")


def check_texts(table, path, text_key, pair_key=None, text_flag="--text-key", pair_flag="--text-pair-key") -> None:
    """Every text (and text pair) present and not blank; one vectorized pass per column."""
    import pyarrow
    import pyarrow.compute as pc

    def missing_text(batch, key):
        values = batch.column(key)
        missing = pc.is_null(values, nan_is_null=True)
        if pyarrow.types.is_string(values.type) or pyarrow.types.is_large_string(values.type):
            missing = pc.or_(missing, blank(values))
        return missing

    require_column(table, text_key, path, text_flag)
    columns = [(text_key, "text")]
    if pair_key:
        require_column(table, pair_key, path, pair_flag)
        columns.append((pair_key, "text pair"))
    for key, name in columns:
        count, first = first_true(missing_text(batch, key) for batch in arrow_batches(table, [key]))
        if count:
            side = f" ({key!r} missing where {text_key!r} is given)" if name == "text pair" else ""
            raise CliError(
                f"{path}: {name} missing or empty in {count} row(s){side}, first at row {first + 1}; "
                "fill or drop those rows"
            )


def refuse_missing(table, key, path, what) -> None:
    """One line naming the first row whose `key` is missing or NaN (one vectorized pass)."""
    import pyarrow.compute as pc

    count, first = first_true(pc.is_null(batch.column(key), nan_is_null=True) for batch in arrow_batches(table, [key]))
    if count:
        raise CliError(
            f"{path}: {what} {key!r} is missing or NaN in {count} row(s), first at row {first + 1}; fill or drop "
            "those rows"
        )


def blank(values):
    """Per row: an empty or whitespace-only string."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.match_substring_regex(values, r"^\s*$"), False)


def not_finite(values):
    import pyarrow.compute as pc

    return pc.invert(pc.fill_null(pc.is_finite(values), True))


def split_eval(table, fraction, seed, path="--train"):
    """(train, eval): a seeded random `fraction` of the rows held out."""
    if not 0 < fraction < 1:
        raise CliError(f"--eval-fraction {fraction} must be between 0 and 1")
    rows = len(table)
    count = max(1, round(rows * fraction))
    if count >= rows:
        raise CliError(f"{path}: {rows} row(s), too few to hold out an eval set; pass --eval FILE")
    split = table.train_test_split(test_size=count, seed=seed, shuffle=True)
    return split["train"], split["test"]


class CutCount:
    """The rows that truncation cut while evaluate or predict scored them, summed over the ranks into one warning:
    a score of a cut text is a score of its start, which the user should know."""

    def __init__(self):
        self.rows, self.longest, self.limit = 0, 0, 0

    def add(self, cut_from, limit: int) -> None:
        cut = [n for n in cut_from if n]
        self.rows += len(cut)
        self.longest = max([self.longest, *cut])
        self.limit = limit

    def warn(self, job, command: str, path) -> None:
        counts = job.gather((self.rows, self.longest, self.limit))
        if not job.is_main or not sum(rows for rows, _, _ in counts):
            return
        rows = sum(r for r, _, _ in counts)
        longest, limit = max(n for _, n, _ in counts), max(n for _, _, n in counts)
        advice = "the model's limit from training; their scores read only what fits"
        print(cut_warning(command, path, rows, longest, limit, advice), file=sys.stderr)


def cut_warning(command: str, path, rows: int, longest: int, limit: int, advice: str) -> str:
    """The one wording of every command's warning about the rows truncation cut."""
    return (
        f"[{command}] warning: {path}: {rows} row(s) longer than {limit} tokens were cut to {limit} (the longest: "
        f"{longest:,} tokens); {advice}"
    )


def workers(rows: int) -> int | None:
    """Tokenizer worker processes for `map`: one per core (at most 8) for large tables, none for small ones."""
    if rows < 2 * ROWS_PER_WORKER:
        return None
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def column_max(table, key) -> int:
    import pyarrow.compute as pc

    return max((pc.max(batch.column(key)).as_py() or 0 for batch in arrow_batches(table, [key])), default=0)


def cached_map(table, function, desc: str, keep_columns=False, **options):
    """`table.map(function)` in batches of MAP_BATCH rows with `options` as its keyword arguments, on worker processes
    for large tables, cached by datasets (a second process of the same job, or a second run on the same file and
    tokenizer, reads the cache); the table's own columns are dropped unless `keep_columns`."""
    return table.map(
        function,
        batched=True,
        batch_size=MAP_BATCH,
        num_proc=workers(len(table)),
        remove_columns=None if keep_columns else table.column_names,
        fn_kwargs=options,
        desc=desc,
    )


class RowProblems:
    """The rows a check found wrong, by problem (in the order the problems are listed): `refuse` raises one line for
    the first problem that has rows, with their count, the first row and the fix."""

    def __init__(self, fixes: dict[str, str], unit: str):
        self.fixes, self.unit = fixes, unit
        self.rows: dict[str, list[int]] = {problem: [] for problem in fixes}

    def add(self, problem: str, row: int) -> None:
        self.rows[problem].append(row)

    def refuse(self, path, first_row=lambda row: f"first at row {row}") -> None:
        for problem, rows in self.rows.items():
            if rows:
                raise CliError(
                    f"{path}: {problem} in {len(rows)} {self.unit}, {first_row(rows[0])}; {self.fixes[problem]}"
                )
