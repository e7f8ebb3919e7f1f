"""The generative form of a reranker: a plain causal LM whose log-odds of a "yes" token over a "no" token at the last
position is the reranker's score, for consumers that load rerankers that way without `trust_remote_code` (vLLM's
`classifier_from_token` / `from_2_way_softmax` path, which Qwen3-Reranker uses; sentence-transformers' `LogitScore`).

The head is the base's LM head (or its input embeddings, where it ties them), untied, with the "yes" row moved so
that W[yes] - W[no] equals the trained `score` weight: every other row, and so generation of any other token, is the
base's. A `score` bias cannot travel (an LM head has none): it shifts every score alike, and is reported.
"""

import json
from pathlib import Path

import torch


def token_id(tokenizer, token: str) -> int:
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{token!r} is {len(ids)} tokens for this tokenizer; give single tokens")
    return ids[0]


def generative_reranker(model, tokenizer, yes: str, no: str, lm_head: torch.Tensor | None = None):
    """(a causal LM whose logit(yes) - logit(no) at the last position is `model`'s score, the score's bias or None).
    `model`: a Stable reranker (one output, last-token pooling, LoRA merged); `lm_head`: the base causal LM's output
    embeddings where the base does not tie them to its input embeddings."""
    from transformers import AutoModelForCausalLM

    if model.config.num_labels != 1 or getattr(model.config, "classifier_pooling", "last") != "last":
        raise ValueError("the generative form is a one-output, last-token reranker's")
    config = model.config.__class__.from_dict(model.config.to_dict())
    for key in ("auto_map", "id2label", "label2id", "reranker_template", "reranker_instruction", "classifier_pooling"):
        if hasattr(config, key):
            delattr(config, key)
    config.architectures, config.tie_word_embeddings = None, False
    lm = AutoModelForCausalLM.from_config(config).float()
    backbone = model.base_model_prefix
    state = {k: v for k, v in model.state_dict().items() if k.startswith(f"{backbone}.")}
    missing, unexpected = lm.load_state_dict(state, strict=False)
    head = lm.get_output_embeddings()
    if unexpected or set(missing) - {f"{name}.weight" for name, m in lm.named_modules() if m is head}:
        raise ValueError(f"the causal LM does not take the classifier's backbone (missing {missing[:3]}, ...)")
    rows = (lm_head if lm_head is not None else model.get_input_embeddings().weight).detach().float().clone()
    yes_id, no_id = token_id(tokenizer, yes), token_id(tokenizer, no)
    rows[yes_id] = rows[no_id] + model.score.weight.detach().float().reshape(-1)
    with torch.no_grad():
        head.weight = torch.nn.Parameter(rows)
    bias = getattr(model.score, "bias", None)
    return lm.eval(), (None if bias is None else float(bias.detach().reshape(-1)[0]))


def save_generative(model, tokenizer, folder, yes: str, no: str, lm_head=None) -> dict:
    """Save the generative form into `folder` (a plain causal LM with the reranker's tokenizer and chat template,
    plus sentence-transformers' CrossEncoder files: a Transformer and a LogitScore module), and return how each
    consumer loads it (also written to `folder/reranker.json`)."""
    folder = Path(folder)
    lm, bias = generative_reranker(model, tokenizer, yes, no, lm_head)
    lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    yes_id, no_id = token_id(tokenizer, yes), token_id(tokenizer, no)
    name = type(lm).__name__.replace("ForCausalLM", "ForSequenceClassification")
    tokens = tokenizer.convert_ids_to_tokens([no_id, yes_id])
    how = {
        "score": f"logit({yes!r}) - logit({no!r}) at the last position",
        "yes_token_id": yes_id,
        "no_token_id": no_id,
        "vllm_hf_overrides": {
            "architectures": [name],
            "classifier_from_token": tokens,
            "method": "from_2_way_softmax",
        },
        "bias_not_carried": bias if bias else None,
        "template": getattr(model.config, "reranker_template", None),
    }
    (folder / "reranker.json").write_text(json.dumps(how, indent=1) + "\n")
    write_sentence_transformers_files(folder, yes_id, no_id)
    return how


def write_sentence_transformers_files(folder: Path, yes_id: int, no_id: int) -> None:
    """modules.json: sentence-transformers' Transformer (text-generation, so it keeps the LM head's logits) then
    LogitScore(yes, no): `CrossEncoder(folder)` scores logit(yes) - logit(no) with no remote code."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_LogitScore",
            "type": "sentence_transformers.cross_encoder.modules.logit_score.LogitScore",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    forward = {"method": "forward", "method_output_name": "logits"}
    transformer = {  # as sentence-transformers 6.3 saves it: pairs as query / document messages, the chat template
        "transformer_task": "text-generation",
        "modality_config": {"text": forward, "message": {**forward, "format": "flat"}},
        "module_output_name": "causal_logits",
    }
    (folder / "sentence_bert_config.json").write_text(json.dumps(transformer, indent=2) + "\n")
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}) + "\n")
    (folder / "1_LogitScore").mkdir(exist_ok=True)
    score = {"true_token_id": yes_id, "false_token_id": no_id, "module_input_name": "causal_logits"}
    (folder / "1_LogitScore" / "config.json").write_text(json.dumps(score, indent=2) + "\n")
