"""The consumer matrix's vLLM columns (tests/test_consumers.py holds the others): each row's folder in vLLM offline and
in its server, held to `stable-models predict`'s scores as written (a regression head gets no activation in vLLM) where
`stable_models.consumers.consumer_table` says "as trained", and shown to differ where it says not."""

import sys

import pytest
import torch
from consumer_rows import QUERY, ROWS, TEXTS, build, documents, predict
from test_vllm import free_port, post, running
from vllm import LLM, PoolingParams
from vllm.distributed import cleanup_dist_env_and_memory

from stable_models.consumers import folder_table
from stable_models.generative import save_generative

TOLERANCE = 1e-4
MAX_LEN = 512


def chat_template_of(folder):
    path = folder / "chat_template.jinja"
    return path.read_text() if path.is_file() else None


def offline(folder, row, cell):
    llm = LLM(model=str(folder), runner="pooling", dtype="float32", enforce_eager=True, max_model_len=MAX_LEN, seed=0)
    try:
        if row.kind == "classifier":
            return torch.tensor([o.outputs.probs for o in llm.classify(TEXTS)], dtype=torch.float64)
        if row.kind == "reward model":
            texts = [t + llm.get_tokenizer().eos_token for t in TEXTS]
            outputs = llm.classify(texts, pooling_params=PoolingParams(use_activation=False))
            return torch.tensor([o.outputs.probs[0] for o in outputs], dtype=torch.float64)
        options = {}
        if row.template != "pair":
            options["chat_template"] = chat_template_of(folder)
        if "add_special_tokens" in cell.how:  # what the cell says to pass
            options["tokenization_kwargs"] = {"add_special_tokens": False}
        return torch.tensor([o.outputs.score for o in llm.score(QUERY, documents(), **options)], dtype=torch.float64)
    finally:
        del llm
        cleanup_dist_env_and_memory()  # as vLLM's own tests do between engines in one process


def served(folder, row, tmp_path):
    port = free_port()
    command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--runner", "pooling"]
    command += ["--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_LEN), "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    if row.kind == "reranker" and row.template != "pair":
        command += ["--chat-template", str(folder / "chat_template.jinja")]
    url, model = f"http://127.0.0.1:{port}", str(folder)
    command[0] = sys.executable
    with running(command, port, tmp_path / "server.log"):
        if row.kind == "classifier":
            got = post(f"{url}/classify", {"model": model, "input": TEXTS})
            return torch.tensor([item["probs"] for item in got["data"]], dtype=torch.float64)
        if row.kind == "reward model":
            eos = folder_eos(folder)
            body = {"model": model, "input": [t + eos for t in TEXTS], "task": "classify", "use_activation": False}
            got = post(f"{url}/pooling", body)
            return torch.tensor([item["data"][0] for item in got["data"]], dtype=torch.float64)
        scored = post(f"{url}/score", {"model": model, "text_1": QUERY, "text_2": documents()})
        scores = torch.tensor(
            [item["score"] for item in sorted(scored["data"], key=lambda item: item["index"])], dtype=torch.float64
        )
        reranked = post(f"{url}/rerank", {"model": model, "query": QUERY, "documents": documents()})
        order = [item["index"] for item in reranked["results"]]
        assert order == scores.argsort(descending=True).tolist()
        return scores


def folder_eos(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).eos_token


def test_vllm_offline_holds_what_the_consumer_table_says_for_every_row(tmp_path):
    """One test over the rows: under pytest, a fifth vLLM engine in one process fails ("pipeline model parallel group
    is not initialized") when each engine has its own test, and not when one test makes them in turn."""
    results = {}
    for i, row in enumerate(ROWS):
        folder = tmp_path / str(i)
        build(row, folder / "model")
        expected = predict(folder / "model", row, folder)
        cell = next(c for c in folder_table(folder / "model") if c.consumer == "vLLM offline")
        assert cell.ok is not None
        results[row.name] = (cell, (offline(folder / "model", row, cell) - expected).abs().max().item())
    wrong = {name: (c.line(), d) for name, (c, d) in results.items() if (d > TOLERANCE if c.ok else d <= 1e-3)}
    assert not wrong, wrong
    # the generative form of the qwen3 reranker: a plain causal LM through vLLM's classifier_from_token path
    row = next(r for r in ROWS if r.sample)
    model, tokenizer = build(row, tmp_path / "reranker")
    expected = predict(tmp_path / "reranker", row, tmp_path)  # the config keeps problem_type regression: no sigmoid
    how = save_generative(model, tokenizer, tmp_path / "generative", "the", "a")
    llm = LLM(
        model=str(tmp_path / "generative"),
        runner="pooling",
        hf_overrides=how["vllm_hf_overrides"],
        dtype="float32",
        enforce_eager=True,
        max_model_len=MAX_LEN,
        seed=0,
    )
    try:
        template = chat_template_of(tmp_path / "generative")
        got = torch.tensor([o.outputs.score for o in llm.score(QUERY, documents(), chat_template=template)])
    finally:
        del llm
        cleanup_dist_env_and_memory()
    assert (got.double() - expected).abs().max() <= TOLERANCE


SERVED = [pytest.param(row, id=row.name) for row in ROWS if row.kind != "reranker" or row.template != "pair"]


@pytest.mark.parametrize("row", SERVED)
def test_the_vllm_server_holds_what_the_consumer_table_says(row, tmp_path):
    """(The pair reranker on /score and /rerank: tests/serving/test_vllm.py.)"""
    build(row, tmp_path / "model")
    expected = predict(tmp_path / "model", row, tmp_path)
    cell = next(c for c in folder_table(tmp_path / "model") if c.consumer == "vLLM server")
    got = served(tmp_path / "model", row, tmp_path)
    if cell.ok:
        assert (got - expected).abs().max() <= TOLERANCE, (cell.line(), got, expected)
    else:
        assert (got - expected).abs().max() > 1e-3, cell.line()


def test_vllm_serves_several_adapters_on_one_base_with_each_ones_predict_scores(tmp_path):
    """train --save-adapter's folders (saved here by the same `save_adapter`): two LoRA rerankers whose `score` is in
    modules_to_save, on one causal-LM base; vLLM (--enable-lora) gives each request its adapter's predict scores."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from vllm.lora.request import LoRARequest

    import stable_models
    from stable_models.adapters import save_adapter

    row = next(r for r in ROWS if r.kind == "reranker" and r.template == "pair" and not r.chat_template)
    model, tokenizer = build(row, tmp_path / "classifier")
    keep = {k: v for k, v in model.config.to_dict().items() if k not in ("auto_map", "architectures", "id2label")}
    keep = {k: v for k, v in keep.items() if k not in ("label2id", "reranker_template", "reranker_instruction")}
    AutoModelForCausalLM.from_config(model.config.__class__.from_dict(keep)).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    expected = []
    for k in range(2):
        torch.manual_seed(k + 1)
        stable = stable_models.from_pretrained(str(tmp_path / "base"), num_labels=1, id2label={0: "score"})
        stable.config.reranker_template, stable.config.reranker_instruction = "pair", ""
        adapted = get_peft_model(stable, LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["q_proj"]))
        with torch.no_grad():  # a trained adapter: LoRA B and the head away from their starting values
            for name, parameter in adapted.named_parameters():
                if "lora_B" in name or ("modules_to_save" in name and "score" in name):
                    parameter.normal_(0, 0.5)
        save_adapter(adapted, tokenizer, tmp_path / f"adapter{k}")
        (tmp_path / f"scores{k}").mkdir()
        expected.append(predict(tmp_path / f"adapter{k}", row, tmp_path / f"scores{k}"))
    assert (expected[0] - expected[1]).abs().max() > 1e-2  # two adapters, two scorings
    name = type(stable).__name__.removeprefix("Stable")
    llm = LLM(
        model=str(tmp_path / "base"),
        runner="pooling",
        hf_overrides={"architectures": [name], "num_labels": 1},
        enable_lora=True,
        max_lora_rank=8,
        max_loras=2,
        dtype="float32",
        enforce_eager=True,
        max_model_len=MAX_LEN,
        seed=0,
    )
    try:
        for k in range(2):
            request = LoRARequest(f"adapter{k}", k + 1, str(tmp_path / f"adapter{k}"))
            got = torch.tensor([o.outputs.score for o in llm.score(QUERY, documents(), lora_request=request)])
            assert (got.double() - expected[k]).abs().max() <= TOLERANCE, k
    finally:
        del llm
        cleanup_dist_env_and_memory()
