"""The Stable embedding model (issue 58, the model): a text's vector from the mask, in fp32, the same alone and in any
padded batch, with pad == eos, and from every consumer that reads the saved folder (this library, transformers with
remote code, sentence-transformers without it, ONNX; vLLM in tests/serving); the eos every text ends with appended by
the saved tokenizer itself. The stock ways of pooling a decoder that the field's bug reports describe (the last
column of a right-padded batch, the token before the first pad id) are shown getting it wrong on the same inputs."""

import json

import pytest
import tiny_tokenizers
import torch
from architectures import BY_NAME, DEFAULT_SAMPLE, make_config, pad_batch, random_sequences

import stable_models
from stable_models.consumers import folder_table
from stable_models.registry import embedding_class_for
from stable_models.tokenization import append_eos

ARCHS = [
    pytest.param(name, marks=() if name in {"qwen2", "gemma2", "llama"} else (pytest.mark.exhaustive,))
    for name in sorted(DEFAULT_SAMPLE)
    if name in BY_NAME
]
LENGTHS = [7, 3, 5, 2]  # padding longer than the sliding windows of the table
TEXTS = ["the film was great", "bad", "i loved the plot but the actor was dull", "not very good"]
WIDE = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, use_sliding_window=False)


def embedder(arch_name, pooling="last", dtype=torch.float32, seed=0, **overrides):
    torch.manual_seed(seed)
    arch = BY_NAME[arch_name]
    model = embedding_class_for(arch.name)(make_config(arch, **overrides), pooling=pooling)
    return model.to(dtype).eval()


def vectors(model, ids, mask=None):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).pooler_output


def alone(model, sequences):
    return torch.cat([vectors(model, s[None]) for s in sequences])


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("arch_name", ARCHS)
def test_a_vector_is_the_same_alone_and_in_a_padded_batch_on_either_side(arch_name, pooling):
    model = embedder(arch_name, pooling)
    sequences = random_sequences(LENGTHS)
    expected = alone(model, sequences)
    assert expected.dtype == torch.float32
    torch.testing.assert_close(expected.norm(dim=-1), torch.ones(len(LENGTHS)), atol=1e-5, rtol=0)
    for side in ("left", "right"):
        got = vectors(model, *pad_batch(sequences, side))
        assert (got - expected).abs().max() <= 1e-5, (side, (got - expected).abs().max())


def test_the_stock_ways_of_pooling_a_decoder_read_a_pad_where_ours_reads_the_text():
    """TEI #642 / sentence-transformers #3208: the last column of a right-padded batch is a pad for every shorter text;
    Qwen3-Embedding #122: with pad == eos, the token before the first pad id is not the text's eos. Ours reads the
    last real token from the mask."""
    model = embedder("qwen2")
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, "right")
    ours = vectors(model, ids, mask)
    with torch.no_grad():
        states = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    last_column = torch.nn.functional.normalize(states[:, -1].float(), dim=-1)
    assert (last_column - alone(model, sequences)).abs().max() > 1e-2  # wrong for the shorter texts
    assert (ours - alone(model, sequences)).abs().max() <= 1e-5
    eos = 2  # pad == eos, and each text ends with its eos, as the saved tokenizer appends it
    with_eos = [torch.cat([s, torch.tensor([eos])]) for s in sequences]
    ids, mask = pad_batch(with_eos, "right", pad_id=eos)
    by_pad_id = (ids == eos).int().argmax(-1) - 1  # the first pad id, minus one: the token before the text's eos
    with torch.no_grad():
        states = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    stock = torch.nn.functional.normalize(states[torch.arange(len(ids)), by_pad_id].float(), dim=-1)
    expected = alone(model, with_eos)
    assert (stock - expected).abs().max() > 1e-2
    assert (vectors(model, ids, mask) - expected).abs().max() <= 1e-5


def test_bf16_vectors_are_fp32_and_within_bf16_noise_of_the_fp32_ones():
    fp32, bf16 = embedder("qwen2"), embedder("qwen2", dtype=torch.bfloat16)
    sequences = random_sequences(LENGTHS)
    expected = alone(fp32, sequences)
    for side in ("left", "right"):
        got = vectors(bf16, *pad_batch(sequences, side))
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert torch.nn.functional.cosine_similarity(got, expected).min() > 0.99


def tokenizer_with_eos(name="qwen2_like"):
    tokenizer = getattr(tiny_tokenizers, name)()
    append_eos(tokenizer)
    return tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen2 embedder (head_dim 32, as vLLM's CPU attention needs), mean pooling, a query prompt, Matryoshka
    dimensions, saved with a tokenizer that appends eos; and the vectors this library gives for TEXTS."""
    folder = tmp_path_factory.mktemp("embedder") / "model"
    tokenizer = tokenizer_with_eos()
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = embedder("qwen2", "mean", **WIDE, **ids)
    model.config.embedding_dimensions = [64, 32]
    model.config.embedding_prompts = {"query": "query: ", "document": "passage: "}
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def ours(folder, tokenizer, texts):
    model = stable_models.from_pretrained(folder).eval()
    assert type(model).__name__ == "StableQwen2ForEmbedding"
    with torch.no_grad():
        return model(**tokenizer(texts, padding=True, return_tensors="pt")).pooler_output


def test_the_saved_folder_loads_back_as_the_embedder_with_its_options(saved):
    folder, tokenizer = saved
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]  # what vLLM runs as an embedding model
    assert config["auto_map"] == {"AutoModel": "modeling_embedding.StableQwen2ForEmbedding"}
    assert config["classifier_pooling"] == "mean" and config["embedding_dimensions"] == [64, 32]
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"] for m in modules] == [
        f"sentence_transformers.models.{name}" for name in ("Transformer", "Pooling", "Normalize")
    ]
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    prompts = json.loads((folder / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"query": "query: ", "document": "passage: "}
    assert "score.weight" not in __import__("safetensors.torch").torch.load_file(str(folder / "model.safetensors"))
    assert stable_models.cli.main(["verify", str(folder)]) == 0


def test_every_consumer_the_row_marks_as_trained_gives_the_same_vectors(saved):
    """The embedder's consumer row, cell by cell, in this venv (vLLM's two: tests/serving)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    folder, tokenizer = saved
    expected = ours(folder, tokenizer, TEXTS)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    cells = {cell.consumer: cell for cell in folder_table(folder)}

    remote = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(remote).__name__ == "StableQwen2ForEmbedding" and cells["transformers, trust_remote_code"].ok
    with torch.no_grad():
        assert (remote(**batch).pooler_output - expected).abs().max() <= 1e-5

    encoder = SentenceTransformer(str(folder))  # no remote code: the stock backbone, Pooling and Normalize
    assert cells["sentence-transformers"].ok
    assert (torch.tensor(encoder.encode(TEXTS)) - expected).abs().max() <= 1e-5
    queries = torch.tensor(encoder.encode_query(TEXTS))  # the saved prompt, as our tokenizer renders it
    assert (queries - ours(folder, tokenizer, [f"query: {t}" for t in TEXTS])).abs().max() <= 1e-5
    documents = torch.tensor(encoder.encode_document(TEXTS))  # the saved document prompt
    assert (documents - ours(folder, tokenizer, [f"passage: {t}" for t in TEXTS])).abs().max() <= 1e-5

    stock = AutoModel.from_pretrained(folder).eval()  # the refused cell: token states, no vector
    assert not cells["transformers, stock class"].ok and not type(stock).__name__.startswith("Stable")
    assert getattr(stock(**batch), "pooler_output", None) is None


def test_onnx_gives_the_vectors(saved, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime

    folder, tokenizer = saved
    model = stable_models.from_pretrained(folder).eval()

    class Vectors(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).pooler_output

    ids = torch.randint(3, 90, (2, 7))
    batch, sequence = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=2)
    torch.onnx.export(
        Vectors(model).eval(),
        (ids, torch.ones_like(ids)),
        str(tmp_path / "embedder.onnx"),
        dynamo=True,
        input_names=["input_ids", "attention_mask"],
        output_names=["vectors"],
        dynamic_shapes={"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}},
    )
    session = onnxruntime.InferenceSession(str(tmp_path / "embedder.onnx"))
    batch = tokenizer(TEXTS, padding=True, return_tensors="np")
    got = session.run(["vectors"], {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})[0]
    assert (torch.from_numpy(got) - ours(folder, tokenizer, TEXTS)).abs().max() <= 1e-4


@pytest.mark.parametrize("name", ["qwen2_like", "gemma_like", "llama_pad_is_eos"])
def test_the_saved_tokenizer_appends_eos_so_every_consumer_pools_the_same_token(name, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = getattr(tiny_tokenizers, name)()
    before = tokenizer("the film was great")["input_ids"]
    assert append_eos(tokenizer) and not append_eos(tokenizer)  # once; then a no-op
    assert tokenizer("the film was great")["input_ids"] == before + [tokenizer.eos_token_id]  # a bos stays
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("the film was great")["input_ids"] == before + [
        tokenizer.eos_token_id
    ]


def test_a_tokenizer_without_eos_is_refused_with_the_fix():
    tokenizer = tiny_tokenizers.qwen2_like()
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="has no eos token.*pooling='mean'"):
        append_eos(tokenizer)


def by_hand(model, sequences, leading):
    """Each text alone through the backbone, the mean of its states after its first `leading` tokens, normalised."""
    with torch.no_grad():
        means = [
            model.model(input_ids=s[None]).last_hidden_state[0, n:].float().mean(0)
            for s, n in zip(sequences, leading, strict=True)
        ]
    return torch.nn.functional.normalize(torch.stack(means), dim=-1)


@pytest.mark.parametrize("arch_name", ["qwen2", "gemma2"])
def test_include_prompt_false_leaves_each_texts_prompt_out_of_the_mean_padded_or_packed(arch_name):
    """sentence-transformers' Pooling(include_prompt=False): the first prompt_length tokens of each text (after any
    left padding) stay out of the mean, on either padding side and in packed rows; with include_prompt=True the same
    call pools them (prompt_length ignored), a different vector."""
    from stable_models import PackedCollator

    torch.manual_seed(0)
    arch = BY_NAME[arch_name]
    cls = embedding_class_for(arch.name)
    model = cls(make_config(arch), pooling="mean", include_prompt=False).eval()
    sequences, leading = random_sequences(LENGTHS), [3, 1, 2, 0]
    expected = by_hand(model, sequences, leading)
    for side in ("left", "right"):
        ids, mask = pad_batch(sequences, side)
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask, prompt_length=torch.tensor(leading)).pooler_output
        assert (got - expected).abs().max() <= 1e-5, side
    packed = PackedCollator(pad_token_id=0)([{"input_ids": s.tolist()} for s in sequences])
    with torch.no_grad():
        got = model(**packed, prompt_length=torch.tensor(leading)).pooler_output
    assert (got - expected).abs().max() <= 1e-5
    with torch.no_grad():  # one count for every text
        got = model(*pad_batch(sequences, "right"), prompt_length=1).pooler_output
    assert (got - by_hand(model, sequences, [1] * len(sequences))).abs().max() <= 1e-5

    model.config.embedding_include_prompt = True  # the prompt counts: prompt_length is ignored
    with torch.no_grad():
        counted = model(*pad_batch(sequences, "left"), prompt_length=torch.tensor(leading)).pooler_output
    assert (counted - by_hand(model, sequences, [0] * len(sequences))).abs().max() <= 1e-5
    assert (counted - expected).abs().max() > 1e-3


def test_a_text_that_is_all_prompt_keeps_its_last_token():
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"]), pooling="mean", include_prompt=False).eval()
    sequences = random_sequences([3, 5])
    with torch.no_grad():
        got = model(*pad_batch(sequences, "left"), prompt_length=torch.tensor([9, 0])).pooler_output
    assert torch.isfinite(got).all()
    assert (got - by_hand(model, sequences, [2, 0])).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def saved_without_prompt(tmp_path_factory):
    """The `saved` embedder's weights and prompts, saved again with include_prompt=False."""
    folder = tmp_path_factory.mktemp("no-prompt") / "model"
    tokenizer = tiny_tokenizers.qwen2_like()
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = embedder("qwen2", "mean", **WIDE, **ids)
    model.config.embedding_prompts = {"query": "query: ", "document": "passage: "}
    model.config.embedding_include_prompt = False
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def test_sentence_transformers_leaves_out_the_prompt_we_leave_out(saved_without_prompt):
    """The folder's Pooling says include_prompt false; `encode_query` / `encode_document` (no remote code) give our
    vectors of the prompted texts with `prompt_length` as sentence-transformers counts it (the prompt alone: its
    trailing space is a token of its own, so the count also covers a text's first word where the space merges into
    it). Where that count covers a whole text ("query: bad"), sentence-transformers returns a zero vector; ours keeps
    the text's last token; so does transformers with remote code. vLLM reads no include_prompt: the consumer row says
    no for it."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    folder, tokenizer = saved_without_prompt
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["include_prompt"] is False
    model = stable_models.from_pretrained(folder).eval()
    assert model.config.embedding_include_prompt is False
    encoder = SentenceTransformer(str(folder))
    remote_model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    covered = TEXTS.index("bad")
    for name, prompt in (("query", "query: "), ("document", "passage: ")):
        count = stable_models.prompt_length(tokenizer, prompt)
        assert count == len(tokenizer(prompt)["input_ids"]) == len(tokenizer(prompt + "bad")["input_ids"])
        batch = tokenizer([prompt + t for t in TEXTS], padding=True, return_tensors="pt")
        with torch.no_grad():
            ours_left_out = model(**batch, prompt_length=count).pooler_output
            ours_counted = model(**batch).pooler_output
        theirs = torch.tensor(encoder.encode(TEXTS, prompt_name=name))
        rest = [i for i in range(len(TEXTS)) if i != covered]
        assert (theirs[rest] - ours_left_out[rest]).abs().max() <= 1e-5, name
        assert (theirs[rest] - ours_counted[rest]).abs().max() > 1e-3  # the prompt's tokens would change the vector
        assert theirs[covered].abs().max() == 0  # sentence-transformers: the mean of nothing
        assert ours_left_out[covered].norm() == pytest.approx(1.0, abs=1e-5)
        with torch.no_grad():  # the folder's own code, as transformers runs it
            remote = remote_model(**batch, prompt_length=count).pooler_output
        assert (remote - ours_left_out).abs().max() <= 1e-5
    cells = {cell.consumer: cell for cell in folder_table(folder)}
    assert cells["sentence-transformers"].ok and cells["transformers, trust_remote_code"].ok
    assert not cells["vLLM offline"].ok and "include_prompt" in cells["vLLM offline"].how
    assert not cells["vLLM server"].ok


def test_the_collator_gives_each_text_its_prompts_length_packed_or_padded():
    """EmbeddingCollator(prompt_tokens=...): queries get the query prompt's count, documents the document prompt's;
    the padded and the packed batch give the vectors of each text alone with its prompt left out."""
    from stable_models import EmbeddingCollator
    from stable_models.embedding_training import MODEL_INPUTS

    torch.manual_seed(0)
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"]), pooling="mean", include_prompt=False).eval()
    features = [  # short texts: packed, several share a row (the long positive sets the row's width)
        {"query_input_ids": [5, 6, 7], "positive_input_ids": [9, 10], "negative_input_ids": [[12, 13]]},
        {"query_input_ids": [16, 17], "positive_input_ids": [19, 20, 21, 22, 23, 24, 25], "negative_input_ids": []},
    ]
    texts = [torch.tensor(t) for t in ([5, 6, 7], [16, 17], [9, 10], [19, 20, 21, 22, 23, 24, 25], [12, 13])]
    expected = by_hand(model, texts, [1, 1, 0, 0, 0])
    for packing in (False, True):
        batch = EmbeddingCollator(tiny_tokenizers.qwen2_like(), packing, {"query": 1, "document": 0})(features)
        assert batch["prompt_length"].tolist() == [1, 1, 0, 0, 0]
        assert len(batch["input_ids"]) == (3 if packing else 5)  # packed: three texts share a row
        with torch.no_grad():
            got = model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}).pooler_output
        assert (got - expected).abs().max() <= 1e-5, packing
