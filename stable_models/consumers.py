"""Who scores a saved folder as `stable-models predict` does: one row of cells per folder, a cell per consumer (the
transformers class with and without remote code, `pipeline`, sentence-transformers, vLLM offline and served, ONNX),
each saying what to pass, or why that consumer cannot give the trained scores. Derived from the folder's config and
tokenizer alone; `stable-models verify` prints it, `train` warns with its refusals, docs/ecosystem.md's table is
written from it, and tests/test_consumers.py (tests/serving for vLLM) holds every cell to predict's scores."""

from dataclasses import dataclass

from .templates import RerankTemplate, adds_special_tokens

COLUMNS = (
    "transformers, trust_remote_code",
    "transformers, stock class",
    "pipeline",
    "sentence-transformers",
    "vLLM offline",
    "vLLM server",
    "ONNX",
)


@dataclass(frozen=True)
class Cell:
    consumer: str
    ok: bool | None  # None: this consumer has no API for this kind of folder
    how: str  # what to pass where ok; why not where refused

    def line(self) -> str:
        mark = {True: "as trained", False: "NOT as trained", None: "not a consumer"}[self.ok]
        return f"{self.consumer}: {mark}: {self.how}"


def folder_kind(config) -> str:
    if getattr(config, "reranker_template", None) is not None:
        return "reranker"
    return "reward model" if dict(config.id2label or {}) in ({0: "reward"}, {"0": "reward"}) else "classifier"


def consumer_table(config, tokenizer) -> list[Cell]:
    """One cell per COLUMNS entry for a folder with this config and tokenizer."""
    kind = folder_kind(config)
    template = RerankTemplate(config.reranker_template, config.reranker_instruction) if kind == "reranker" else None
    added = adds_special_tokens(tokenizer)
    rendered = "inputs rendered as in the first column"
    return [
        Cell(COLUMNS[0], True, remote_code_inputs(kind, template)),
        stock_cell(config, rendered),
        pipeline_cell(kind, template, added),
        sentence_transformers_cell(kind, template, tokenizer),
        *vllm_cells(kind, template, added, getattr(config, "problem_type", None)),
        Cell(COLUMNS[6], True, f"torch.onnx.export(model, (input_ids, attention_mask), dynamo=True); {rendered}"),
    ]


def remote_code_inputs(kind, template) -> str:
    load = "AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)"
    if template is None:
        eos = ", each response ending in eos as TRL renders it" if kind == "reward model" else ""
        return f"{load}; tokenizer(texts{eos})"
    if template.is_pair:
        return f"{load}; tokenizer(queries, documents)"
    return f"{load}; tokenizer.apply_chat_template([{{role: query}}, {{role: document}}], tokenize=True)"


def stock_cell(config, rendered) -> Cell:
    import transformers

    architecture = (config.architectures or ["?"])[0]
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    if getattr(transformers, architecture, None) is None:
        why = f"transformers has no {architecture}: only trust_remote_code=True loads this folder"
    elif getattr(config, "classifier_pooling", "last") != "last":
        why = "it pools the last token; this folder pools the mean"
    elif config.pad_token_id is not None and config.pad_token_id in eos:
        why = "pad == eos: it pools the token before a trailing eos (TRL's rewards, chat templates)"
    else:
        return Cell(COLUMNS[1], True, f"AutoModelForSequenceClassification.from_pretrained(folder); {rendered}")
    return Cell(COLUMNS[1], False, why)


def pipeline_cell(kind, template, added) -> Cell:
    call = 'pipeline("text-classification", model=folder, trust_remote_code=True'
    if kind == "classifier":
        return Cell(COLUMNS[2], True, f"{call}, top_k=None): predict's probabilities")
    if kind == "reward model":
        return Cell(COLUMNS[2], True, f'{call}, function_to_apply="none"): the reward')
    if template.is_pair:
        return Cell(COLUMNS[2], True, f'{call}, function_to_apply="none") on {{"text": query, "text_pair": document}}')
    if added:
        return Cell(COLUMNS[2], False, f"it tokenizes a rendered pair with add_special_tokens=True, adding {added[0]}")
    return Cell(
        COLUMNS[2], True, f'{call}, function_to_apply="none") on tokenizer.apply_chat_template(..., tokenize=False)'
    )


def sentence_transformers_cell(kind, template, tokenizer) -> Cell:
    if template is None:
        return Cell(COLUMNS[3], None, "CrossEncoder scores (query, document) pairs: rerankers only")
    load = "CrossEncoder(folder, trust_remote_code=True).predict / .rank (sigmoid by default)"
    if template.is_pair:
        if getattr(tokenizer, "chat_template", None):
            why = "it renders pairs through the tokenizer's chat template, not as the tokenizer's text pair (or raises "
            return Cell(COLUMNS[3], False, why + "where that template has no query / document roles)")
        return Cell(COLUMNS[3], True, f"{load}: the tokenizer's text pair, cut in the document")
    if not template.document_is_last:
        return Cell(
            COLUMNS[3],
            True,
            f"{load}: the folder's chat template; {{query}} follows {{document}}, so an over-long "
            "input is cut elsewhere than in predict",
        )
    return Cell(COLUMNS[3], True, f"{load}: the folder's chat template, an over-long document cut as predict cuts it")


def vllm_cells(kind, template, added, problem_type=None) -> list[Cell]:
    llm = 'LLM(folder, runner="pooling")'
    if kind == "classifier":
        return [Cell(COLUMNS[4], True, f"{llm}.classify(texts)"), Cell(COLUMNS[5], True, "/classify")]
    if kind == "reward model":
        raw = "PoolingParams(use_activation=False)"
        return [
            Cell(COLUMNS[4], True, f"{llm}.classify(texts, pooling_params={raw}): the reward"),
            Cell(COLUMNS[5], True, '/pooling with "use_activation": false: the reward'),
        ]
    keep_end = "max_tokens_per_doc keeps the template's end, cutting the document alone"
    # vLLM applies no activation to a regression head (what train saves for rerankers), a sigmoid to any other
    activation = "the score as predict writes it" if problem_type == "regression" else "sigmoid(score)"
    if template.is_pair:
        return [
            Cell(COLUMNS[4], True, f"{llm}.score(query, documents): {activation}; no chat_template"),
            Cell(COLUMNS[5], True, f"/score and /rerank: {activation}; no --chat-template; {keep_end}"),
        ]
    read = "vLLM 0.32 reads no template from the folder: "
    offline = f"{llm}.score(query, documents, chat_template=FOLDER/chat_template.jinja's text): {activation}"
    if added:
        why = f"it tokenizes the rendered pair with add_special_tokens=True, adding {added[0]}"
        return [
            Cell(COLUMNS[4], True, f"{read}{offline}, tokenization_kwargs={{'add_special_tokens': False}}"),
            Cell(COLUMNS[5], False, why + " (the server has no switch)"),
        ]
    return [
        Cell(COLUMNS[4], True, read + offline),
        Cell(
            COLUMNS[5],
            True,
            f"{read}--chat-template FOLDER/chat_template.jinja; /score and /rerank: {activation}; {keep_end}",
        ),
    ]


def folder_table(folder) -> list[Cell]:
    """consumer_table for a saved folder (its config.json and tokenizer; an adapter folder's stable_config.json)."""
    from transformers import AutoConfig, AutoTokenizer

    from .adapters import adapter_config, is_adapter_folder

    config = adapter_config(folder)[1] if is_adapter_folder(folder) else AutoConfig.from_pretrained(folder)
    return consumer_table(config, AutoTokenizer.from_pretrained(folder))


def markdown(rows: dict) -> str:
    """{row name: cells} as a markdown table (a row per folder, a column per consumer, each cell yes / no / n/a with
    a note number), then the numbered notes: what to pass, or why not."""
    notes: list[str] = []
    mark = {True: "yes", False: "**no**", None: "n/a"}

    def cell(c: Cell) -> str:
        if c.how not in notes:
            notes.append(c.how)
        return f"{mark[c.ok]} [{notes.index(c.how) + 1}]"

    table = "| folder | " + " | ".join(COLUMNS) + " |\n|---|" + "---|" * len(COLUMNS) + "\n"
    table += "".join(f"| {name} | " + " | ".join(cell(c) for c in cells) + " |\n" for name, cells in rows.items())
    return table + "\n" + "".join(f"{i}. {note}\n" for i, note in enumerate(notes, 1))
