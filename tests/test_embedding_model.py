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
