"""The consumer matrix: every cell of `stable_models.consumers.consumer_table` for the folders of
tests/consumer_rows.py, held to `stable-models predict`'s scores (fp32, 1e-4, after the consumer's activation) where
the table says "as trained", and shown to fail or differ where it says not. vLLM's cells run in the serving tier
(tests/serving/test_consumers_vllm.py). docs/ecosystem.md's table is written from the same table (test below)."""

import re
from pathlib import Path

import pytest
import torch
from consumer_rows import (
    BY_ROW,
    QUERY,
    ROWS,
    TEXTS,
    as_predicted,
    build,
    documents,
    embedder_row,
    form_rows,
    messages,
    predict,
    rendered,
)

from stable_models.consumers import COLUMNS, consumer_table, folder_table, markdown

TOLERANCE = 1e-4
MAIN = COLUMNS[:5] + COLUMNS[7:]  # vLLM's two columns: tests/serving
_folders = {}


@pytest.fixture
def folder_of(tmp_path_factory):
    def made(row, long=False):
        key = (row.name, long)
        if key not in _folders:
            folder = tmp_path_factory.mktemp("consumers")
            model, tokenizer = build(row, folder / "model")
            if long:  # the limit train saves: the short documents' length, so that the long ones are cut
                tokenizer.model_max_length = max(len(ids) for ids in rendered(tokenizer, row)) + 2
                tokenizer.save_pretrained(folder / "model")
            _folders[key] = (folder / "model", tokenizer, predict(folder / "model", row, folder, long))
        return _folders[key]

    return made


def padded(tokenizer, ids):
    return tokenizer.pad({"input_ids": ids}, return_tensors="pt")


def logits(model, tokenizer, ids):
    with torch.no_grad():
        return model(**padded(tokenizer, ids)).logits


def stable_models_loader(folder, row, tokenizer, long=False):
    import stable_models

    model = stable_models.from_pretrained(folder).eval()
    return as_predicted(row, logits(model, tokenizer, rendered(tokenizer, row, long)))


def transformers_remote(folder, row, tokenizer, long=False):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__.startswith("Stable")
    return as_predicted(row, logits(model, tokenizer, rendered(tokenizer, row, long)))


def transformers_stock(folder, row, tokenizer, long=False):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert not type(model).__name__.startswith("Stable")
    return as_predicted(row, logits(model, tokenizer, rendered(tokenizer, row, long)))


def pipeline_scores(folder, row, tokenizer, long=False):
    from transformers import pipeline

    pipe = pipeline("text-classification", model=str(folder), trust_remote_code=True, batch_size=4)
    if row.kind == "classifier":
        out = pipe(TEXTS, top_k=None)
        names = ["negative", "neutral", "positive"]
        return torch.tensor([[{d["label"]: d["score"] for d in r}[n] for n in names] for r in out], dtype=torch.float64)
    if row.kind == "reward model":
        inputs = [t + tokenizer.eos_token for t in TEXTS]
    elif row.template == "pair":
        inputs = [{"text": QUERY, "text_pair": d} for d in documents(long)]
    else:
        inputs = [tokenizer.apply_chat_template(messages(d), tokenize=False) for d in documents(long)]
    return torch.tensor([r["score"] for r in pipe(inputs, function_to_apply="none")], dtype=torch.float64)


def sentence_transformers_scores(folder, row, tokenizer, long=False):
    from sentence_transformers import CrossEncoder

    encoder = CrossEncoder(str(folder), trust_remote_code=True)
    pairs = [(QUERY, d) for d in documents(long)]
    scores = torch.tensor(encoder.predict(pairs, activation_fn=torch.nn.Identity()), dtype=torch.float64)
    ranked = encoder.rank(QUERY, documents(long))
    assert [r["corpus_id"] for r in ranked] == scores.argsort(descending=True).tolist()
    sigmoid = torch.tensor(encoder.predict(pairs), dtype=torch.float64)  # its default activation for one output
    torch.testing.assert_close(sigmoid, scores.sigmoid(), atol=1e-6, rtol=0)
    return scores


def onnx_scores(folder, row, tokenizer, long=False):
    pytest.importorskip("onnxruntime")
    from test_export import export, run
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    session = export(model, Path(folder).parent / "model.onnx", dynamo=True)
    batch = padded(tokenizer, rendered(tokenizer, row, long))
    return as_predicted(row, run(session, batch["input_ids"], batch["attention_mask"]))


CONSUMERS = dict(
    zip(
        MAIN,
        [
            stable_models_loader,
            transformers_remote,
            transformers_stock,
            pipeline_scores,
            sentence_transformers_scores,
            onnx_scores,
        ],
        strict=True,
    )
)


def holds(cell, consume, expected):
    """An "as trained" cell gives predict's scores; a refused one raises or differs; n/a has nothing to call."""
    if cell.ok is None:
        return
    if cell.ok:
        got = consume()
        assert got.shape == expected.shape
        assert (got - expected).abs().max() <= TOLERANCE, (cell.line(), got, expected)
        return
    try:
        got = consume()
    except (ValueError, OSError) as error:  # a refusal by the consumer itself
        assert str(error)
        return
    assert (got - expected).abs().max() > 1e-3, (cell.line(), "claimed refused, yet it gives predict's scores")


def marks(row):
    return () if row.sample else (pytest.mark.exhaustive,)


CELLS = [pytest.param(row, column, id=f"{row.name}-{column}", marks=marks(row)) for row in ROWS for column in MAIN]


@pytest.mark.parametrize("row, column", CELLS)
def test_each_cell_holds_what_the_consumer_table_says(row, column, folder_of):
    folder, tokenizer, expected = folder_of(row)
    cell = next(c for c in folder_table(folder) if c.consumer == column)
    holds(cell, lambda: CONSUMERS[column](folder, row, tokenizer), expected)


@pytest.mark.parametrize(
    "name",
    [  # byte-level tokenizers: sentence-transformers finds the template's end by rendering two fillers, which a
        # word-level fixture maps to the same <unk> as the template's own words
        pytest.param(r.name, marks=marks(r))
        for r in ROWS
        if r.kind == "reranker" and r.template != "pair" and r.tokenizer == "qwen2_like"
    ],
)
def test_an_over_long_document_is_cut_inside_the_document_with_the_templates_end_kept(name, folder_of):
    """sentence-transformers' suffix-restoring truncation (its default) cuts where predict cuts: the template's end
    is kept, the document loses its tail. The transformers column renders whole, so it is not the reference here."""
    row = BY_ROW[name]
    folder, tokenizer, expected = folder_of(row, long=True)
    whole = [len(ids) for ids in rendered(tokenizer, row, long=True)]
    assert max(whole) > tokenizer.model_max_length >= min(whole)  # some rows cut, some whole
    scores = sentence_transformers_scores(folder, row, tokenizer, long=True)
    assert (scores - expected).abs().max() <= TOLERANCE


def test_a_pair_reranker_on_a_chat_tokenizer_is_scored_through_the_chat_template_by_sentence_transformers(
    folder_of, tmp_path
):
    """What the refusal says: ChatML renders the query and document roles as turns, not as the text pair; a chat
    template without those roles makes CrossEncoder raise."""
    from sentence_transformers import CrossEncoder

    folder, tokenizer, expected = folder_of(BY_ROW["reranker, pair, tokenizer with a chat template"])
    encoder = CrossEncoder(str(folder), trust_remote_code=True)
    turns = [tokenizer.apply_chat_template(messages(d), tokenize=True, return_dict=True)["input_ids"] for d in TEXTS]
    got = torch.tensor(encoder.predict([(QUERY, d) for d in TEXTS], activation_fn=torch.nn.Identity()))
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    assert (got - logits(model, tokenizer, turns)[:, 0]).abs().max() <= TOLERANCE
    assert (got.double() - expected).abs().max() > 1e-3
    encoder.tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError, match="cannot carry a 'query'/'document' pair"):
        encoder.predict([(QUERY, TEXTS[0])])


def test_the_docs_table_is_the_consumer_table_of_the_matrix_rows(tmp_path):
    """docs/ecosystem.md's matrix is `consumers.markdown` of these rows (regenerate it with the snippet in the
    docs' comment); the CHANGELOG keeps what it said before."""
    rows = {}
    for row in ROWS:
        build(row, tmp_path / str(len(rows)))
        rows[row.name] = folder_table(tmp_path / str(len(rows)))
    rows.update(form_rows(tmp_path / "forms"))
    rows.update(embedder_row(tmp_path))
    docs = (Path(__file__).parent.parent / "docs" / "ecosystem.md").read_text()
    written = re.search(r"<!-- consumer matrix: begin -->\n(.*?)<!-- consumer matrix: end -->", docs, re.S)
    assert written, "docs/ecosystem.md has no consumer matrix"
    assert written.group(1) == markdown(rows), "docs/ecosystem.md's consumer matrix is stale: regenerate it"


def test_a_refused_cell_names_its_reason_in_verify(tmp_path, capsys):
    from stable_models import cli

    build(BY_ROW["reranker, format string, tokenizer adds bos"], tmp_path / "f")
    assert cli.main(["verify", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "vLLM server: NOT as trained: it tokenizes the rendered pair with add_special_tokens=True, adding" in out
    assert "sentence-transformers: as trained" in out


def test_the_table_has_a_cell_per_consumer_for_each_kind(tmp_path):
    for i, row in enumerate(ROWS):
        model, tokenizer = build(row, tmp_path / str(i))
        cells = consumer_table(model.config, tokenizer)
        assert [c.consumer for c in cells] == list(COLUMNS)
        assert (cells[4].ok is None) == (row.kind != "reranker")


@pytest.mark.parametrize(
    "template",
    [
        "qwen3",
        'Q «{query}» {{literal}} "quoted" \\ {instruction}\n{document} {{% raw %}} {{{{ x }}}}\tend',
        "{document}\nasked: {query}",
    ],
    ids=["qwen3", "escapes", "document-first"],
)
def test_the_chat_template_renders_every_template_text_as_render_does(template):
    """Quotes, braces, backslashes, tabs, non-ASCII and Jinja syntax in a template's text reach the chat template's
    output unchanged; a conversation without the two roles goes to the tokenizer's own template."""
    from tiny_tokenizers import qwen2_like

    from stable_models.templates import RerankTemplate

    tokenizer = qwen2_like()
    rendering = RerankTemplate(template, "find {it}")
    chat = rendering.chat_template(original="{{ 'own: ' + messages[0]['content'] }}")
    tokenizer.chat_template = chat
    query, document = 'a "q" {x}', "d\\oc «é»"
    assert (
        tokenizer.apply_chat_template(messages(document, query), tokenize=False) == rendering.render(query, document)[0]
    )
    other = rendering.render(query, document, instruction="per row")[0]
    assert tokenizer.apply_chat_template(messages(document, query), tokenize=False, instruction="per row") == other
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "own: hi"
    again = RerankTemplate("{query} {document}", "").chat_template(original=chat)  # retrained from this folder
    assert "own: " in again and again.count("stable_models reranker template") == 1


def test_train_warns_about_each_consumer_that_will_not_render_the_reranker_as_trained():
    import tiny_tokenizers
    from architectures import BY_NAME, make_models
    from consumer_rows import FORMAT

    from stable_models.cli.ranking import TASK

    said = []
    for make, template, refused in (
        (tiny_tokenizers.gemma_like, FORMAT, ["pipeline", "vLLM server"]),  # a bos they add and training did not
        (tiny_tokenizers.qwen2_like, "qwen3", []),
    ):
        tokenizer = make()
        model, _ = make_models(BY_NAME["llama"], num_labels=1, vocab_size=len(tokenizer))
        options = TASK.Options(template=template, no_packing=True)
        said.clear()
        TASK.prepare_model(options, None, model, tokenizer, lambda line, file=None: said.append(line))
        warnings = [line for line in said if "warning" in line]
        assert [w.split("] warning: ")[1].split(" will not score")[0] for w in warnings] == refused, said
        assert all("adding <bos>" in w for w in warnings)
