"""The embedder's vLLM cells of the consumer matrix (tests/test_embedding_model.py holds the others): vLLM's pooling
runner, offline (`LLM.embed`) and served (`/v1/embeddings`, `dimensions` included), reads the folder's
sentence-transformers files and tokenizer and gives this library's vectors."""

import sys

import tiny_tokenizers
import torch
from architectures import BY_NAME, make_config
from test_vllm import free_port, post, running
from vllm import LLM
from vllm.distributed import cleanup_dist_env_and_memory

import stable_models
from stable_models.consumers import folder_table
from stable_models.registry import embedding_class_for
from stable_models.tokenization import append_eos

TOLERANCE = 1e-4
TEXTS = ["the film was great", "bad", "i loved the plot but the actor was dull", "not very good"]
WIDE = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, use_sliding_window=False)


def build(folder, pooling):
    tokenizer = tiny_tokenizers.qwen2_like()
    append_eos(tokenizer)
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"], **WIDE, **ids), pooling=pooling)
    model.config.embedding_dimensions = [64, 32]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with torch.no_grad():
        loaded = stable_models.from_pretrained(folder).eval()
        return loaded(**tokenizer(TEXTS, padding=True, return_tensors="pt")).pooler_output.double()


def test_vllm_embeds_offline_as_the_folder_says(tmp_path):
    expected = build(tmp_path / "model", "last")
    cell = next(c for c in folder_table(tmp_path / "model") if c.consumer == "vLLM offline")
    assert cell.ok
    llm = LLM(model=str(tmp_path / "model"), runner="pooling", dtype="float32", enforce_eager=True, max_model_len=128)
    try:
        got = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)], dtype=torch.float64)
    finally:
        del llm
        cleanup_dist_env_and_memory()
    assert (got - expected).abs().max() <= TOLERANCE, cell.line()


def test_the_vllm_server_embeds_as_the_folder_says_with_dimensions(tmp_path):
    expected = build(tmp_path / "model", "mean")
    cell = next(c for c in folder_table(tmp_path / "model") if c.consumer == "vLLM server")
    assert cell.ok
    port, model = free_port(), str(tmp_path / "model")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--runner", "pooling"]
    command += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "128", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with running(command, port, tmp_path / "server.log"):
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        full = post(url, {"model": model, "input": TEXTS})
        short = post(url, {"model": model, "input": TEXTS, "dimensions": 32})
    got = torch.tensor([item["embedding"] for item in full["data"]], dtype=torch.float64)
    assert (got - expected).abs().max() <= TOLERANCE, cell.line()
    truncated = torch.nn.functional.normalize(expected[:, :32], dim=-1)  # Matryoshka: the first 32, normalised
    got = torch.tensor([item["embedding"] for item in short["data"]], dtype=torch.float64)
    assert (got - truncated).abs().max() <= TOLERANCE


def test_predict_with_the_vllm_engine_writes_the_torch_engines_vectors(tmp_path):
    """`stable-models predict --engine vllm` on an embedder: the same rows in the same order, each `embedding` within
    1e-4 of the torch engine's, the saved query prompt put first by both."""
    import json

    from stable_models import cli

    build(tmp_path / "model", "last")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config["embedding_prompts"] = {"query": "query: ", "document": ""}
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    rows = {}
    for engine in ("torch", "vllm"):
        out = tmp_path / f"{engine}.jsonl"
        argv = ["predict", "--model", str(tmp_path / "model"), "--data", str(data), "--output", str(out)]
        assert cli.main([*argv, "--engine", engine, "--prompt-name", "query"]) == 0
        rows[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    cleanup_dist_env_and_memory()
    assert [r["text"] for r in rows["vllm"]] == [r["text"] for r in rows["torch"]] == TEXTS
    vectors = {e: torch.tensor([r["embedding"] for r in rows[e]], dtype=torch.float64) for e in rows}
    assert (vectors["vllm"] - vectors["torch"]).abs().max() <= TOLERANCE
