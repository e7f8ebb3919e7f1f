"""Who scores a saved folder as `stable-models predict` does: one row of cells per folder, a cell per consumer (this
library's loader, the transformers class with and without remote code, `pipeline`, sentence-transformers, vLLM offline
and served, ONNX), each saying what to pass, or why that consumer cannot give the trained scores. Derived from the
folder's form, config and tokenizer alone; `stable-models verify` prints it, `train` prints its load and serve lines
from it and warns with its refusals, docs/ecosystem.md's table is written from it, and tests/test_consumers.py and
tests/test_folder_forms.py (tests/serving for vLLM) hold every cell to predict's scores."""

import json
from dataclasses import dataclass
from pathlib import Path

from .modeling_files import (
    ADAPTER,
    CLASSIFIER,
    EMBEDDER,
    GENERATIVE,
    GENERATIVE_MARK,
    MERGED,
    RERANKER,
    REWARD_MODEL,
    folder_form,
    model_kind,
)
from .templates import RerankTemplate, adds_special_tokens

COLUMNS = (
    "stable_models",
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


LOADER = "stable_models.from_pretrained(folder)"


def consumer_table(config, tokenizer, form: str = MERGED, generative: dict | None = None) -> list[Cell]:
    """One cell per COLUMNS entry for a folder of this form (modeling_files.folder_form) with this config (an
    adapter's: its stable_config.json) and tokenizer; `generative`: a generative folder's reranker.json."""
    if form == GENERATIVE:
        return generative_cells(generative or {})
    kind = model_kind(config)
    if kind == EMBEDDER:
        return embedder_cells(config, form)
    template = RerankTemplate(config.reranker_template, config.reranker_instruction) if kind == RERANKER else None
    if form == ADAPTER:
        return adapter_cells(config, kind, template)
    added = adds_special_tokens(tokenizer)
    rendered = "inputs rendered as in the second column"
    return [
        Cell(COLUMNS[0], True, f"{LOADER} (no code from the folder runs); {rendered}"),
        Cell(COLUMNS[1], True, remote_code_inputs(kind, template)),
        stock_cell(config, rendered),
        pipeline_cell(kind, template, added),
        sentence_transformers_cell(kind, template, tokenizer),
        *vllm_cells(kind, template, added, getattr(config, "problem_type", None)),
        Cell(COLUMNS[7], True, f"torch.onnx.export(model, (input_ids, attention_mask), dynamo=True); {rendered}"),
    ]


def adapter_cells(config, kind, template) -> list[Cell]:
    """An adapter folder (train --save-adapter): peft's files and stable_config.json, no config.json and no weights of
    the base. This library merges it as predict does; vLLM applies it as a LoRA module on the base."""
    merge_first = f"an adapter folder has no config.json: merge it first ({LOADER}.save_pretrained(merged_folder))"
    stock = (config.architectures or ["?"])[0]
    overrides = {"architectures": [stock], "num_labels": config.num_labels}
    lora = "lora_request=LoRARequest(NAME, 1, folder)"
    llm = f'LLM(BASE, runner="pooling", hf_overrides={json.dumps(overrides)}, enable_lora=True)'
    if getattr(config, "classifier_pooling", "last") != "last":
        offline = Cell(
            COLUMNS[5], False, "vLLM pools the base by its last token (it has no pooling files); this pools the mean"
        )
    elif template is not None and not template.is_pair:
        offline = Cell(COLUMNS[5], False, "vLLM reads no chat template from an adapter: merge it first")
    else:
        call = "score(query, documents" if kind == RERANKER else "classify(texts"
        offline = Cell(COLUMNS[5], True, f"{llm}.{call}, {lora}), BASE as adapter_config.json names it")
    return [
        Cell(COLUMNS[0], True, f"{LOADER}: the base with stable_config.json, the adapter merged (merge=False: peft's)"),
        Cell(COLUMNS[1], False, merge_first),
        Cell(COLUMNS[2], False, "with peft installed it builds the stock class on the base: no stable_config.json"),
        Cell(COLUMNS[3], False, merge_first),
        Cell(COLUMNS[4], False if kind == RERANKER else None, merge_first if kind == RERANKER else ST_RERANKERS),
        offline,
        Cell(COLUMNS[6], None, "--enable-lora --lora-modules NAME=folder is not held by a test here: use vLLM offline"),
        Cell(COLUMNS[7], False, merge_first),
    ]


def embedder_cells(config, form=MERGED) -> list[Cell]:
    """An embedder: one vector per text (`pooler_output`), the same from every consumer that pools by the folder's
    sentence-transformers files or runs its class; the token-states consumers give no vector. An adapter folder has
    none of those files: this library merges it, every other consumer needs it merged first."""
    from .modeling_embedding import ST_POOLING, base_model_name

    if form == ADAPTER:
        merge_first = f"an adapter folder has no config.json: merge it first ({LOADER}.save_pretrained(merged_folder))"
        loads = f"{LOADER}: the base with stable_config.json, the adapter merged (merge=False: peft's)"
        return [Cell(COLUMNS[0], True, loads)] + [Cell(column, False, merge_first) for column in COLUMNS[1:]]

    vector = "(**tokenizer(texts, padding=True, return_tensors='pt')).pooler_output"
    pooling = f"Pooling {ST_POOLING[config.classifier_pooling]}" + (", Normalize" if config.embedding_normalize else "")
    base = base_model_name(config.model_type)
    left_out = not getattr(config, "embedding_include_prompt", True)  # the prompt's tokens stay out of the mean
    if left_out:
        vector = vector.replace(
            "return_tensors='pt')", "return_tensors='pt'), prompt_length=prompt_length(tokenizer, prompt)"
        )
    cells = [
        Cell(COLUMNS[0], True, f"{LOADER}{vector} (no code from the folder runs)"),
        Cell(COLUMNS[1], True, f"AutoModel.from_pretrained(folder, trust_remote_code=True){vector}"),
        Cell(COLUMNS[2], False, f"AutoModel gives the stock {base}: token states, no pooled vector"),
        Cell(COLUMNS[3], False, 'pipeline("feature-extraction") gives token states, no pooled vector'),
        Cell(
            COLUMNS[4],
            True,
            f"SentenceTransformer(folder).encode(texts), no remote code ({pooling}); encode_query / encode_document "
            "add the saved prompts",
        ),
        Cell(COLUMNS[5], True, 'LLM(folder, runner="pooling").embed(texts): the pooling and Normalize of modules.json'),
        Cell(COLUMNS[6], True, "/v1/embeddings (dimensions= where config.json lists embedding_dimensions)"),
        Cell(COLUMNS[7], True, "torch.onnx.export(model, (input_ids, attention_mask), dynamo=True): pooler_output"),
    ]
    if not left_out:
        return cells
    vllm = "vLLM reads no include_prompt: its mean would count the prompt's tokens (predict --engine vllm refuses)"
    sentence_transformers = (
        f"SentenceTransformer(folder).encode_query / encode_document, no remote code ({pooling}, include_prompt "
        "false: the prompt's tokens left out as here)"
    )
    return cells[:4] + [
        Cell(COLUMNS[4], True, sentence_transformers),
        Cell(COLUMNS[5], False, vllm),
        Cell(COLUMNS[6], False, vllm),
        Cell(COLUMNS[7], False, "an export of (input_ids, attention_mask) counts the prompt in the mean"),
    ]


def generative_cells(how: dict) -> list[Cell]:
    """A reranker's generative form (train --save-generative): a plain causal LM, no score head, no code files."""
    score = f"{how.get('score', 'logit(yes) - logit(no) at the last position')} ({GENERATIVE_MARK})"
    overrides = json.dumps(how.get("vllm_hf_overrides", {}))
    return [
        Cell(COLUMNS[0], False, "a causal LM with no score head: it refuses the folder and names the loaders here"),
        Cell(COLUMNS[1], None, "no code files: a plain causal LM (next column)"),
        Cell(COLUMNS[2], True, f"AutoModelForCausalLM.from_pretrained(folder), the chat template's ids: {score}"),
        Cell(COLUMNS[3], False, "text-classification builds a new, untrained score head on a causal LM"),
        Cell(COLUMNS[4], True, "CrossEncoder(folder).predict / .rank: LogitScore, no remote code"),
        Cell(COLUMNS[5], True, f'LLM(folder, runner="pooling", hf_overrides={overrides}).{TEMPLATED_SCORE}'),
        Cell(COLUMNS[6], None, f"--hf-overrides '{overrides}' is not held by a test here: use vLLM offline"),
        Cell(COLUMNS[7], None, "not held by a test here: export the merged folder"),
    ]


TEMPLATED_SCORE = "score(query, documents, chat_template=FOLDER/chat_template.jinja's text)"
ST_RERANKERS = "CrossEncoder scores (query, document) pairs: rerankers only"


def remote_code_inputs(kind, template) -> str:
    load = "AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)"
    if template is None:
        eos = ", each response ending in eos as TRL renders it" if kind == REWARD_MODEL else ""
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
        return Cell(COLUMNS[2], True, f"AutoModelForSequenceClassification.from_pretrained(folder); {rendered}")
    return Cell(COLUMNS[2], False, why)


def pipeline_cell(kind, template, added) -> Cell:
    call = 'pipeline("text-classification", model=folder, trust_remote_code=True'
    if kind == CLASSIFIER:
        return Cell(COLUMNS[3], True, f"{call}, top_k=None): predict's probabilities")
    if kind == REWARD_MODEL:
        return Cell(COLUMNS[3], True, f'{call}, function_to_apply="none"): the reward')
    if template.is_pair:
        return Cell(COLUMNS[3], True, f'{call}, function_to_apply="none") on {{"text": query, "text_pair": document}}')
    if added:
        return Cell(COLUMNS[3], False, f"it tokenizes a rendered pair with add_special_tokens=True, adding {added[0]}")
    return Cell(
        COLUMNS[3], True, f'{call}, function_to_apply="none") on tokenizer.apply_chat_template(..., tokenize=False)'
    )


def sentence_transformers_cell(kind, template, tokenizer) -> Cell:
    if template is None:
        return Cell(COLUMNS[4], None, ST_RERANKERS)
    load = "CrossEncoder(folder, trust_remote_code=True).predict / .rank (sigmoid by default)"
    if template.is_pair:
        if getattr(tokenizer, "chat_template", None):
            why = "it renders pairs through the tokenizer's chat template, not as the tokenizer's text pair (or raises "
            return Cell(COLUMNS[4], False, why + "where that template has no query / document roles)")
        return Cell(COLUMNS[4], True, f"{load}: the tokenizer's text pair, cut in the document")
    if not template.document_is_last:
        return Cell(
            COLUMNS[4],
            True,
            f"{load}: the folder's chat template; {{query}} follows {{document}}, so an over-long "
            "input is cut elsewhere than in predict",
        )
    return Cell(COLUMNS[4], True, f"{load}: the folder's chat template, an over-long document cut as predict cuts it")


def vllm_cells(kind, template, added, problem_type=None) -> list[Cell]:
    llm = 'LLM(folder, runner="pooling")'
    if kind == CLASSIFIER:
        return [Cell(COLUMNS[5], True, f"{llm}.classify(texts)"), Cell(COLUMNS[6], True, "/classify")]
    if kind == REWARD_MODEL:
        raw = "PoolingParams(use_activation=False)"
        return [
            Cell(COLUMNS[5], True, f"{llm}.classify(texts, pooling_params={raw}): the reward"),
            Cell(COLUMNS[6], True, '/pooling with "use_activation": false: the reward'),
        ]
    keep_end = "max_tokens_per_doc keeps the template's end, cutting the document alone"
    # vLLM applies no activation to a regression head (what train saves for rerankers), a sigmoid to any other
    activation = "the score as predict writes it" if problem_type == "regression" else "sigmoid(score)"
    if template.is_pair:
        return [
            Cell(COLUMNS[5], True, f"{llm}.score(query, documents): {activation}; no chat_template"),
            Cell(COLUMNS[6], True, f"/score and /rerank: {activation}; no --chat-template; {keep_end}"),
        ]
    read = "vLLM 0.32 reads no template from the folder: "
    offline = f"{llm}.{TEMPLATED_SCORE}: {activation}"
    if added:
        why = f"it tokenizes the rendered pair with add_special_tokens=True, adding {added[0]}"
        return [
            Cell(COLUMNS[5], True, f"{read}{offline}, tokenization_kwargs={{'add_special_tokens': False}}"),
            Cell(COLUMNS[6], False, why + " (the server has no switch)"),
        ]
    return [
        Cell(COLUMNS[5], True, read + offline),
        Cell(
            COLUMNS[6],
            True,
            f"{read}--chat-template FOLDER/chat_template.jinja; /score and /rerank: {activation}; {keep_end}",
        ),
    ]


def folder_table(folder) -> list[Cell]:
    """consumer_table for a saved folder of any form: its config (an adapter's stable_config.json) and tokenizer."""
    from transformers import AutoTokenizer

    from .loading import folder_config

    form = folder_form(folder)
    if form == GENERATIVE:
        return consumer_table(None, None, form, json.loads((Path(folder) / GENERATIVE_MARK).read_text()))
    return consumer_table(folder_config(folder), AutoTokenizer.from_pretrained(folder), form)


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
