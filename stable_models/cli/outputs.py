"""What the commands write: predict's rows (streamed, every task, .jsonl, .csv or .parquet, optionally ranked within
groups), the end of an evaluation (report.json, plots, the printed report), and a model saved in place after
--calibrate. Nothing is left half-written: files are completed aside and moved into place.
"""

import bisect
import contextlib
import csv
import json
import os
import shutil
from pathlib import Path

from .plots import PLOTS_HINT


class PredictionWriter:
    """predict's rows as they are scored: each rank appends JSON lines to its own part file; `finish` has rank 0 join
    the parts in rank order into --output's format, adding each row's rank within its group when `ranked_by` =
    (group column, score field) is given (keeping the `top_k` best of each group), and move the result onto --output
    only when it is complete. In a CSV file a dict-valued field becomes one column per key, named with the task's
    `csv_prefixes` (classification: p_<label>) or the field's name and "_". Ranks need only (group, score) per row in
    memory: one pass over the parts collects them, a second writes."""

    def __init__(self, output: Path, job, columns: list[str], ranked_by=None, top_k=None, csv_prefixes=None):
        self.output, self.job, self.columns, self.ranked_by, self.top_k = output, job, columns, ranked_by, top_k
        self.csv_prefixes = csv_prefixes or {}
        self.part = self.part_of(job.rank)
        self.handle = open(self.part, "w", encoding="utf-8")

    def part_of(self, rank: int) -> Path:
        return self.output.with_name(f"{self.output.name}.rank{rank}.part")

    def write(self, rows: list[dict]) -> None:
        self.handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    def discard(self) -> None:
        self.handle.close()
        self.part.unlink(missing_ok=True)

    def finish(self) -> None:
        self.handle.close()
        self.job.barrier()
        if not self.job.is_main:
            return
        parts = [self.part_of(rank) for rank in range(self.job.world)]
        joined = self.output.with_name(f"{self.output.name}.part")
        try:
            ranks = self.group_scores(parts) if self.ranked_by else None
            with row_sink(joined, self.output.suffix, self.columns, self.csv_prefixes) as write_row:
                for row in rows_of(parts):
                    if ranks is not None:
                        group, field = self.ranked_by
                        scores = ranks[group_of(row[group])]
                        row["rank"] = rank_in(scores, row[field])
                        if self.top_k and row["rank"] > self.top_k:
                            continue
                    write_row(row)
            os.replace(joined, self.output)
        finally:
            joined.unlink(missing_ok=True)
            for part in parts:
                part.unlink(missing_ok=True)

    def group_scores(self, parts) -> dict:
        group, field = self.ranked_by
        scores: dict = {}
        for row in rows_of(parts):
            scores.setdefault(group_of(row[group]), []).append(row[field])
        return {key: sorted(values) for key, values in scores.items()}


def rank_in(sorted_scores: list, value) -> int:
    """A score's rank among its group's scores (sorted ascending): 1 = highest; ties share the better rank."""
    return len(sorted_scores) - bisect.bisect_right(sorted_scores, value) + 1


def group_of(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def rows_of(parts):
    for part in parts:
        with open(part, encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)


@contextlib.contextmanager
def row_sink(path: Path, suffix: str, columns: list[str], prefixes: dict):
    """A function writing one row into `path` in --output's format (JSON lines, CSV, or Parquet: row groups of
    PARQUET_ROWS, a dict-valued field as a struct column, the schema from the first rows), closed on leaving."""
    if suffix != ".parquet":
        with open(path, "w", newline="", encoding="utf-8") as handle:
            yield row_writer(handle, suffix, columns, prefixes)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    pending, writer = [], None

    def flush():
        nonlocal writer
        if not pending and writer is not None:
            return
        table = pa.Table.from_pylist(pending, schema=writer.schema if writer else None)
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
        pending.clear()

    def write(row):
        pending.append(row)
        if len(pending) >= PARQUET_ROWS:
            flush()

    try:
        yield write
        flush()
    finally:
        if writer is not None:
            writer.close()


PARQUET_ROWS = 10_000  # a row group: memory stays flat in the file's rows


def row_writer(handle, suffix: str, columns: list[str], prefixes: dict):
    """A function writing one row: a JSON line, or a CSV row (lists of labels joined by ';', conversations as JSON,
    a dict-valued field spread over one column per key, named with its prefix)."""
    if suffix != ".csv":
        return lambda row: handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    writer = csv.DictWriter(handle, fieldnames=columns)
    writer.writeheader()

    def write(row):
        flat = {}
        for key, value in row.items():
            if isinstance(value, dict):
                flat.update({f"{prefixes.get(key, key + '_')}{k}": v for k, v in value.items()})
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                flat[key] = ";".join(value)
            elif isinstance(value, (list, tuple)):
                flat[key] = json.dumps(value, ensure_ascii=False)
            else:
                flat[key] = value
        writer.writerow(flat)

    return write


def write_evaluation(args, model, evaluation) -> None:
    """The end of `evaluate` (a task's `task_steps.Evaluation`): the model saved in place when --calibrate changed
    it, the plots, report.json, the printed report and what --calibrate folded in."""
    report = evaluation.report
    if "calibration" in report:
        save_in_place(model, Path(args.model))
    report_dir = Path(args.report_dir or Path(args.model) / "evaluation")
    report_dir.mkdir(parents=True, exist_ok=True)
    log = Path(args.model) / "training_log.json"
    report["plots"] = evaluation.draw(report_dir, json.loads(log.read_text()) if log.is_file() else None)
    (report_dir / "report.json").write_text(json.dumps(report, indent=1))
    print(evaluation.text(report))
    if "calibration" in report:
        c = report["calibration"]
        print(
            f"calibrated: {evaluation.fitted} {c['temperature']:.3f} folded into {args.model} (NLL "
            f"{c['nll_before']:.4f} -> {c['nll_after']:.4f}, ECE {c['ece_before']:.4f} -> {c['ece_after']:.4f})"
        )
    print(f"report: {report_dir / 'report.json'}" + ("" if report["plots"] else f" (no plots: {PLOTS_HINT})"))


def save_in_place(model, folder: Path) -> None:
    """Save next to `folder`, then swap the files in, so an interrupted save leaves the old checkpoint whole."""
    staging = folder / ".stable-models-saving"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    for item in staging.iterdir():
        if item.name != "README.md":
            os.replace(item, folder / item.name)
    shutil.rmtree(staging, ignore_errors=True)
