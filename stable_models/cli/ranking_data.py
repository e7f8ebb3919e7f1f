"""Reranking data in the layouts users have, read and checked into one shape: a table of query groups (`query`,
`documents`, `relevance`, optional `teacher` scores, `row`: the first input row of the group).

- FlagEmbedding: `query`, `pos` (list), `neg` (list), optional `pos_scores` / `neg_scores` (teacher scores) and
  `prompt` (an instruction per row);
- sentence-transformers n-tuples: `query`, `positive`, `negative` or `negative_1` ... `negative_n`;
- ms-swift: `messages` (the query is the last user turn), `positive_messages`, `negative_messages` (lists of
  conversations; a document is its messages' content);
- pointwise rows: `query`, `document` and a relevance (`--label-key`, 0/1 or graded 0-3), grouped by `query` or
  `--group-key`.

Each (query, document) becomes token ids through a template (`stable_models.templates.RerankTemplate`): the tokenizer's
text pair, Qwen3-Reranker's instruction format, or the user's own; an over-long input is cut in the document, never in
the query or the template.
"""

import functools
import math
import sys
from dataclasses import dataclass

from ..templates import RerankTemplate
from .data import CHECK_BATCH, MAP_BATCH, RowProblems, cached_map, no_progress_bars, require_column
from .errors import CliError


@dataclass(frozen=True)
class RankingLayout:
    """Which of the reranking layouts a table has."""

    kind: str  # "flag", "tuples", "messages" or "pointwise"
    teacher: bool = False
    prompt: bool = False

    def describe(self) -> str:
        names = {
            "flag": "FlagEmbedding query / pos / neg",
            "tuples": "sentence-transformers query / positive / negatives",
            "messages": "ms-swift messages / positive_messages / negative_messages",
            "pointwise": "pointwise query / document / relevance rows",
        }
        return names[self.kind] + (", teacher scores" if self.teacher else "")


def negative_columns(columns) -> list[str]:
    numbered = sorted((c for c in columns if c.startswith("negative_") and c[9:].isdigit()), key=lambda c: int(c[9:]))
    return numbered or (["negative"] if "negative" in columns else [])


def ranking_layout(table, options=None) -> RankingLayout | None:
    """Which layout a table has, or None (not reranking data). Pointwise rows need `query` and `document` (and are
    not taken for a text-pair classifier's file, which names its columns with --text-key / --text-pair-key)."""
    columns = set(table.column_names)
    if {"query", "pos"} <= columns:
        return RankingLayout("flag", teacher="pos_scores" in columns, prompt="prompt" in columns)
    if {"query", "positive"} <= columns:
        return RankingLayout("tuples")
    if {"messages", "positive_messages"} <= columns:
        return RankingLayout("messages")
    if {"query", "document"} <= columns and not (options is not None and getattr(options, "text_pair_key", None)):
        return RankingLayout("pointwise")
    return None


def content(messages) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages or [])


def last_user_turn(messages) -> str:
    users = [m for m in messages or [] if m.get("role") == "user"]
    return str((users[-1] if users else {}).get("content") or "")


def to_groups(batch, indices, layout: RankingLayout):
    """One `map` batch of grouped rows as query groups."""
    out = {"query": [], "documents": [], "relevance": [], "row": [], "prompt": []}
    if layout.teacher:
        out["teacher"] = []
    count = len(next(iter(batch.values())))
    for i in range(count):
        if layout.kind == "flag":
            positives, negatives = list(batch["pos"][i] or []), list(batch["neg"][i] or []) if "neg" in batch else []
            query = batch["query"][i]
        elif layout.kind == "tuples":
            positives = [batch["positive"][i]]
            negatives = [batch[c][i] for c in negative_columns(batch) if batch[c][i] is not None]  # rows may have fewer
            query = batch["query"][i]
        else:
            positives = [content(m) for m in batch["positive_messages"][i] or []]
            negatives = [content(m) for m in (batch.get("negative_messages") or [[]] * count)[i] or []]
            query = last_user_turn(batch["messages"][i])
        out["query"].append(query)
        out["documents"].append(positives + negatives)
        out["relevance"].append([1.0] * len(positives) + [0.0] * len(negatives))
        out["row"].append(indices[i] + 1)
        out["prompt"].append(batch["prompt"][i] if layout.prompt else None)
        if layout.teacher:
            out["teacher"].append(
                list(batch["pos_scores"][i] or []) + list(batch.get("neg_scores", [[]] * count)[i] or [])
            )
    return out


SHAPES = {  # what a layout's column holds: (is the Arrow type right, is a value right, the words)
    "text": (
        lambda t: pa_types().is_string(t) or pa_types().is_large_string(t),
        lambda v: v is None or isinstance(v, str),
        "a text",
    ),
    "texts": (
        lambda t: (
            (pa_types().is_list(t) or pa_types().is_large_list(t))
            and (pa_types().is_string(t.value_type) or pa_types().is_large_string(t.value_type))
        ),
        lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
        "a list of texts",
    ),
    "scores": (
        lambda t: (
            (pa_types().is_list(t) or pa_types().is_large_list(t))
            and (pa_types().is_integer(t.value_type) or pa_types().is_floating(t.value_type))
        ),
        lambda v: v is None or (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)),
        "a list of numbers",
    ),
}


def pa_types():
    import pyarrow

    return pyarrow.types


def wanted_shapes(layout: RankingLayout, columns) -> dict:
    if layout.kind == "flag":
        shapes = {"query": "text", "pos": "texts", "neg": "texts", "prompt": "text"}
        shapes |= {"pos_scores": "scores", "neg_scores": "scores"}
    elif layout.kind == "tuples":
        shapes = {"query": "text", "positive": "text"} | dict.fromkeys(negative_columns(columns), "text")
    else:
        shapes = {}
    return {column: shape for column, shape in shapes.items() if column in columns}


def check_shapes(table, layout: RankingLayout, path) -> None:
    """Each column holds what the layout says (a text, a list of texts, a list of numbers): one line naming the first
    row that does not. The Arrow type answers for a whole column; rows are looked at only when it is not right."""
    schema = table.data.schema
    for column, shape in wanted_shapes(layout, table.column_names).items():
        right_type, right_value, words = SHAPES[shape]
        if right_type(schema.field(column).type) or pa_types().is_null(schema.field(column).type):
            continue
        for start in range(0, len(table), 65_536):
            values = table[start : start + 65_536][column]
            bad = next((i for i, v in enumerate(values) if not right_value(v)), None)
            if bad is not None:
                shown = repr(values[bad])
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise CliError(f"{path}: {column!r} holds {words} per row; row {start + bad + 1} holds {shown}")


def read_groups(table, layout: RankingLayout, options, path, need_positive=True):
    """The table as checked query groups (see the module's docstring); one line naming the first bad row otherwise."""
    if layout.kind == "pointwise":
        groups = pointwise_groups(table, options, path)
    else:
        check_shapes(table, layout, path)
        with no_progress_bars():
            groups = table.map(
                to_groups,
                batched=True,
                batch_size=MAP_BATCH,
                with_indices=True,
                remove_columns=table.column_names,
                fn_kwargs={"layout": layout},
                desc="grouping",
            )
    check_groups(groups, path, need_positive, layout)
    return groups


def pointwise_groups(table, options, path):
    """Pointwise rows grouped by `query` (or --group-key), groups in the order of their first row."""
    import datasets

    from .data import refuse_missing

    key = getattr(options, "group_key", None) or "query"
    label = getattr(options, "label_key", None) or "label"
    for column, flag in (("query", "--task ranking"), ("document", "--task ranking"), (key, "--group-key")):
        require_column(table, column, path, flag)
    require_column(table, label, path, "--label-key")
    refuse_missing(table, label, path, "relevance")
    frame = table.select_columns(list(dict.fromkeys(["query", "document", label, key]))).to_pandas()
    relevance = frame[label]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in relevance.head(1000)):
        raise CliError(f"{path}: relevance {label!r} must hold numbers (0/1, or graded 0-3)")
    relevance = relevance.astype("float64")
    bad = (~relevance.map(math.isfinite)) | (relevance < 0)
    if bad.any():
        raise CliError(
            f"{path}: relevance {label!r} is negative or not finite in {int(bad.sum())} row(s), first at row "
            f"{int(bad.to_numpy().nonzero()[0][0]) + 1}; use 0 for irrelevant and positive grades for relevant"
        )
    frame["_relevance"], frame["_row"] = relevance, range(1, len(frame) + 1)
    grouped = frame.groupby(frame[key].map(str), sort=False)
    return datasets.Dataset.from_dict(
        {
            "query": [str(g["query"].iloc[0]) for _, g in grouped],
            "documents": [[str(d) for d in g["document"]] for _, g in grouped],
            "relevance": [g["_relevance"].tolist() for _, g in grouped],
            "row": [int(g["_row"].iloc[0]) for _, g in grouped],
            "prompt": [None] * grouped.ngroups,
        }
    )


def check_groups(groups, path, need_positive: bool, layout: RankingLayout) -> None:
    """A group needs a query, non-empty documents, finite relevances and teacher scores (one per document), and,
    for training and evaluation, a positive document."""
    problems = RowProblems(
        {
            "query missing or empty": "fill or drop those rows",
            "a document missing or empty": "fill or drop those rows",
            "no document": "fill or drop those rows",
            "relevance not finite": "fill or drop those rows",
            "no positive document": "every query needs at least one relevant document",
            "teacher scores missing, not finite or not one per document": "give pos_scores / neg_scores as long as "
            "pos / neg",
        },
        "group(s)" if layout.kind == "pointwise" else "row(s)",
    )
    for batch in groups.iter(batch_size=CHECK_BATCH):
        for i, row in enumerate(batch["row"]):
            documents, relevance = batch["documents"][i], batch["relevance"][i]
            if not str(batch["query"][i] or "").strip():
                problems.add("query missing or empty", row)
            if not documents:
                problems.add("no document", row)
            if any(not str(d or "").strip() for d in documents):
                problems.add("a document missing or empty", row)
            if any(r is None or not math.isfinite(r) for r in relevance):
                problems.add("relevance not finite", row)
            elif need_positive and not any(r > 0 for r in relevance):
                problems.add("no positive document", row)
            if "teacher" in batch:
                teacher = batch["teacher"][i] or []
                if len(teacher) != len(documents) or any(t is None or not math.isfinite(t) for t in teacher):
                    problems.add("teacher scores missing, not finite or not one per document", row)
    group_note = " (the group's first row)" if layout.kind == "pointwise" else ""
    problems.refuse(path, lambda row: f"first at row {row}{group_note}")


def explode(groups):
    """One row per document: `group` (the group's index), `query`, `document`, `relevance`, `position` in the group
    (the first stage's rank), `prompt`."""

    def rows(batch, indices):
        out = {"group": [], "query": [], "document": [], "relevance": [], "position": [], "prompt": []}
        for i, index in enumerate(indices):
            for position, (document, relevance) in enumerate(
                zip(batch["documents"][i], batch["relevance"][i], strict=True)
            ):
                out["group"].append(index)
                out["query"].append(batch["query"][i])
                out["document"].append(document)
                out["relevance"].append(relevance)
                out["position"].append(position)
                out["prompt"].append(batch["prompt"][i])
        return out

    with no_progress_bars():
        return groups.map(rows, batched=True, with_indices=True, remove_columns=groups.column_names)


@functools.cache
def template_of(text: str, instruction: str | None) -> RerankTemplate:
    """The library's `RerankTemplate` (built once per text and instruction), with a bad --template as one line."""
    try:
        return RerankTemplate(text, instruction)
    except ValueError as error:
        raise CliError(f"--template: {error}") from None


def quiet_about_length(tokenizer) -> None:
    """Documents are tokenized whole to measure them, then cut to the limit: the tokenizer's warning that a sequence
    longer than model_max_length "will result in indexing errors" does not apply (transformers gives it once per
    tokenizer, and this marks it given)."""
    tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True


def template_ids(template, tokenizer, queries, documents, limit, prompts=None):
    """`template.ids`, quiet about lengths, with a query too long for the limit as one line."""
    quiet_about_length(tokenizer)
    try:
        return template.ids(tokenizer, queries, documents, limit, prompts)
    except ValueError as error:
        raise CliError(str(error)) from None


def tokenize_groups(batch, tokenizer, template: RerankTemplate, limit: int):
    """One `map` batch of groups as token ids per document, their total length (for the evaluation cadence) and
    the longest document."""
    queries = [q for q, docs in zip(batch["query"], batch["documents"], strict=True) for _ in docs]
    prompts = [p for p, docs in zip(batch["prompt"], batch["documents"], strict=True) for _ in docs]
    documents = [d for docs in batch["documents"] for d in docs]
    flat, _ = template_ids(template, tokenizer, queries, documents, limit, prompts)
    out, start = {"input_ids": [], "length": [], "longest": []}, 0
    for docs in batch["documents"]:
        ids = flat[start : start + len(docs)]
        start += len(docs)
        out["input_ids"].append(ids)
        out["length"].append(sum(map(len, ids)))
        out["longest"].append(max(map(len, ids)))
    return out


def tokenized_groups(groups, tokenizer, template: RerankTemplate, limit: int):
    return cached_map(
        groups,
        tokenize_groups,
        "tokenizing groups",
        keep_columns=True,
        tokenizer=tokenizer,
        template=template,
        limit=limit,
    )


def corpus_documents(path: str, encoding=None) -> list[str]:
    """The non-empty texts of a --corpus file (its 'text', 'document' or 'passage' column)."""
    from .data import read_table

    table = read_table(path, encoding)
    key = next((k for k in ("text", "document", "passage") if k in table.column_names), None)
    if key is None:
        raise CliError(f"--corpus {path}: no 'text', 'document' or 'passage' column")
    return [str(t) for t in table[key] if t is not None and str(t).strip()]


def bm25_hits(queries: list[str], documents: list[str], depth: int):
    """(indices, scores), each [queries, depth]: the `depth` documents BM25 (bm25s, English stopwords) ranks
    highest for each query."""
    import importlib.util

    if importlib.util.find_spec("bm25s") is None:
        raise CliError("BM25 (--mine-negatives, an embedder's evaluate) needs bm25s: pip install 'stable_models[cli]'")
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(documents, stopwords="en", show_progress=False), show_progress=False)
    found, scores = retriever.retrieve(
        bm25s.tokenize(queries, stopwords="en", show_progress=False), k=depth, show_progress=False
    )
    return found, scores


def mined_groups(groups, options, say):
    """The groups with --mine-negatives K hard negatives from --corpus FILE, where asked (the two go together)."""
    if bool(options.mine_negatives) != bool(options.corpus):
        raise CliError("--mine-negatives K and --corpus FILE go together")
    if not options.mine_negatives:
        return groups
    return mine_negatives(groups, options.corpus, options.mine_negatives, say, options.encoding)


def mine_negatives(groups, corpus_path: str, count: int, say, encoding=None):
    """--mine-negatives K --corpus FILE: each group gains up to K hard negatives, the corpus documents BM25 (bm25s)
    ranks highest for its query that are not already in the group (its positives included) and share a term with
    it."""
    corpus = corpus_documents(corpus_path, encoding)
    widest = max(len(d) for d in groups["documents"])
    found, scores = bm25_hits(list(groups["query"]), corpus, min(len(corpus), count + widest))
    mined, positives_found = [], 0
    for documents, relevance, hits, values in zip(
        groups["documents"], groups["relevance"], found.tolist(), scores.tolist(), strict=True
    ):
        present = set(documents)
        positives = {d for d, r in zip(documents, relevance, strict=True) if r > 0}
        positives_found += len(positives & {corpus[j] for j, value in zip(hits, values, strict=True) if value > 0})
        picked = [corpus[j] for j, value in zip(hits, values, strict=True) if value > 0 and corpus[j] not in present]
        mined.append(list(dict.fromkeys(picked))[:count])

    def extend(batch, indices):
        batch["documents"] = [d + mined[i] for d, i in zip(batch["documents"], indices, strict=True)]
        batch["relevance"] = [r + [0.0] * len(mined[i]) for r, i in zip(batch["relevance"], indices, strict=True)]
        if "teacher" in batch:
            raise CliError("--mine-negatives: the file has teacher scores, which mined documents would lack")
        return batch

    with no_progress_bars():
        groups = groups.map(extend, batched=True, with_indices=True)
    say(
        f"[train] mined {sum(map(len, mined))} BM25 negatives from {len(corpus)} corpus documents "
        f"({sum(1 for m in mined if len(m) < count)} group(s) got fewer than {count}; {positives_found} hit(s) that "
        "were the group's own positive dropped)",
        file=sys.stderr,
    )
    return groups
