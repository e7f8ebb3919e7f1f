"""Embedding data in the layouts users have, read into training rows: a query, one positive, its hard negatives.

- query groups: FlagEmbedding's `query` / `pos` (list) / `neg` (list), the reranker's layout;
- sentence-transformers' columns: `anchor` (or `query`) / `positive` / `negative` or `negative_1` ... `negative_n`
  or `negatives` (a list); plain pairs are the same without negatives.

Groups are read and checked by the reranker's reader (`ranking_data.read_groups`: empty queries or documents, a group
without a positive); a group with several positives gives a row per positive. A document a group lists as both
positive and negative is refused.
"""

from .data import RowProblems, cached_map, no_progress_bars
from .errors import CliError
from .ranking_data import ranking_layout, read_groups

LAYOUTS = (
    "query / pos / neg (FlagEmbedding), anchor or query / positive / negative_1..n or negatives "
    "(sentence-transformers), or anchor or query / positive pairs"
)


def normalized(table, path):
    """The table in one of the reranker's layouts: `anchor` named `query`, a `negatives` list as FlagEmbedding's."""
    if "anchor" in table.column_names and "query" not in table.column_names:
        table = table.rename_column("anchor", "query")
    if "negatives" in table.column_names and "positive" in table.column_names:
        with no_progress_bars():
            table = cached_map(table, to_flag, "layout")
    layout = ranking_layout(table)
    if layout is None or layout.kind in ("pointwise", "messages"):
        raise CliError(f"{path}: not embedding data (columns: {', '.join(table.column_names)}); use {LAYOUTS}")
    return table, layout


def to_flag(batch):
    return {"query": batch["query"], "pos": [[p] for p in batch["positive"]], "neg": batch["negatives"]}


def read_groups_checked(table, options, path):
    """The table's query groups, checked (see the module's docstring)."""
    table, layout = normalized(table, path)
    groups = read_groups(table, layout, options, path, need_positive=True)
    problems = RowProblems({"a document listed as both positive and negative": "drop it from one side"}, "group")
    for i, (documents, relevance) in enumerate(zip(groups["documents"], groups["relevance"], strict=True)):
        positives = {d for d, r in zip(documents, relevance, strict=True) if r > 0}
        if any(d in positives for d, r in zip(documents, relevance, strict=True) if r <= 0):
            problems.add("a document listed as both positive and negative", groups["row"][i])
    problems.refuse(path)
    return groups, layout


def training_rows(groups):
    """A row per (query, positive), with the group's negatives."""

    def rows(batch):
        out = {"query": [], "positive": [], "negatives": []}
        for query, documents, relevance in zip(batch["query"], batch["documents"], batch["relevance"], strict=True):
            negatives = [d for d, r in zip(documents, relevance, strict=True) if r <= 0]
            for document, r in zip(documents, relevance, strict=True):
                if r > 0:
                    out["query"].append(query)
                    out["positive"].append(document)
                    out["negatives"].append(negatives)
        return out

    with no_progress_bars():
        return cached_map(groups, rows, "rows")


def tokenized(rows, tokenizer, prompts: dict, limit: int):
    """Token ids of each row's query (after the query prompt), positive and negatives (after the document prompt),
    cut to `limit` tokens (the tokenizer keeps its eos), and the tokens of the row in `length`."""

    def encode(batch, tokenizer, query_prompt, document_prompt, limit):
        cut = {"truncation": True, "max_length": limit}
        queries = tokenizer([query_prompt + q for q in batch["query"]], **cut)["input_ids"]
        positives = tokenizer([document_prompt + p for p in batch["positive"]], **cut)["input_ids"]
        negatives = [
            tokenizer([document_prompt + n for n in group], **cut)["input_ids"] if group else []
            for group in batch["negatives"]
        ]
        lengths = [len(q) + len(p) + sum(map(len, n)) for q, p, n in zip(queries, positives, negatives, strict=True)]
        return {
            "query_input_ids": queries,
            "positive_input_ids": positives,
            "negative_input_ids": negatives,
            "length": lengths,
        }

    return cached_map(
        rows,
        encode,
        "tokenizing",
        tokenizer=tokenizer,
        query_prompt=prompts.get("query", ""),
        document_prompt=prompts.get("document", ""),
        limit=limit,
    )
