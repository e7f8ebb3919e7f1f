"""The folders of the consumer matrix (docs/ecosystem.md, "Same scores everywhere"), built as `stable-models train`
saves them, and `stable-models predict`'s scores of each: the reference every consumer is held to. Shared by
tests/test_consumers.py and the serving tier (vLLM)."""

import json
from dataclasses import dataclass, field

import tiny_tokenizers
import torch
from architectures import BY_NAME, make_models

from stable_models.templates import RerankTemplate, attach_template

# vLLM's CPU attention needs head_dim >= 32; Qwen2 with no sliding window (vLLM refuses a window on some layers only)
WIDE = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    use_sliding_window=False,
    max_position_embeddings=512,  # room for the qwen3 template, which the tiny BPE spells out byte by byte
)
TEXTS = ["the film was great", "bad", "i loved the plot but the actor was dull", "not very good", "it was fine"]
ARCH_KWARGS = {"gemma2": dict(query_pre_attn_scalar=32)}
QUERY = "is the film good"
FORMAT = "Query: {query}\nDocument: {document}\nRelevant:"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Row:
    name: str
    kind: str  # "classifier", "reward model" or "reranker"
    tokenizer: str = "qwen2_like"  # a tiny_tokenizers builder
    arch: str = "qwen2"  # the architecture the tokenizer reloads with (AutoTokenizer picks the class by model type)
    template: str | None = None
    instruction: str | None = None
    chat_template: str | None = None  # the base tokenizer's own chat template
    sample: bool = False  # in the default run (the others: -m exhaustive)
    extra: dict = field(default_factory=dict)


ROWS = [
    Row("classifier", "classifier"),
    Row("reward model", "reward model"),
    Row("reranker, pair", "reranker", template="pair"),
    Row("reranker, qwen3 + instruction", "reranker", template="qwen3", instruction="judge the film", sample=True),
    Row("reranker, format string", "reranker", template=FORMAT, chat_template=CHATML),
    # where cells change: the refusals
    Row("reward model, pad == eos", "reward model", tokenizer="llama_pad_is_eos", arch="llama"),
    Row(
        "reranker, format string, tokenizer adds bos", "reranker", tokenizer="gemma_like", arch="llama", template=FORMAT
    ),
    Row("reranker, pair, tokenizer with a chat template", "reranker", template="pair", chat_template=CHATML),
]
BY_ROW = {row.name: row for row in ROWS}


def build(row: Row, folder, max_length=None):
    """The row's tiny Qwen2 folder, saved as train saves it; returns (model, tokenizer)."""
    tokenizer = getattr(tiny_tokenizers, row.tokenizer)()
    if row.chat_template:
        tokenizer.chat_template = row.chat_template
    if max_length:
        tokenizer.model_max_length = max_length
    labels = {"classifier": ["negative", "neutral", "positive"], "reward model": ["reward"], "reranker": ["score"]}
    names = labels[row.kind]
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model, _ = make_models(BY_NAME[row.arch], num_labels=len(names), **WIDE, **ARCH_KWARGS.get(row.arch, {}), **ids)
    model.config.id2label, model.config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    if row.kind != "classifier":  # as train saves reward models and rerankers: one unbounded output
        model.config.problem_type = "regression"
    with torch.no_grad():  # a head whose outputs differ clearly between texts
        model.score.weight.normal_(0, 1.0)
    if row.kind == "reranker":
        attach_template(model, tokenizer, RerankTemplate(row.template, row.instruction))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def documents(long=False):
    return [t + (" and the plot was dull" * 12 if long and i % 2 == 0 else "") for i, t in enumerate(TEXTS)]


def predict(folder, row: Row, tmp_path, long=False) -> torch.Tensor:
    """`stable-models predict`'s scores: probabilities (classifier), rewards, or reranker scores, in input order."""
    from stable_models import cli

    data, out = tmp_path / "data.jsonl", tmp_path / "predicted.jsonl"
    if row.kind == "reranker":
        rows = [{"query": QUERY, "document": d} for d in documents(long)]
    else:
        rows = [{"text": t} for t in TEXTS]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["predict", "--model", str(folder), "--data", str(data), "--output", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    if row.kind == "classifier":
        names = ["negative", "neutral", "positive"]
        return torch.tensor([[r["probabilities"][n] for n in names] for r in written], dtype=torch.float64)
    key = "reward" if row.kind == "reward model" else "score"
    return torch.tensor([r[key] for r in written], dtype=torch.float64)


def rendered(tokenizer, row: Row, long=False) -> list[list[int]]:
    """The token ids a transformers user feeds, as the folder tells them (the consumer table's first column)."""
    if row.kind == "classifier":
        return tokenizer(TEXTS)["input_ids"]
    if row.kind == "reward model":
        return tokenizer([t + tokenizer.eos_token for t in TEXTS])["input_ids"]
    if row.template == "pair":
        return tokenizer([QUERY] * len(TEXTS), documents(long))["input_ids"]
    return [
        list(tokenizer.apply_chat_template(messages(d), tokenize=True, return_dict=True)["input_ids"])
        for d in documents(long)
    ]


def messages(document, query=QUERY):
    return [{"role": "query", "content": query}, {"role": "document", "content": document}]


def as_predicted(row: Row, logits: torch.Tensor) -> torch.Tensor:
    """A consumer's raw logits as predict reports them: softmax probabilities for a classifier, else the one output."""
    logits = logits.double()
    return logits.softmax(-1) if row.kind == "classifier" else logits.reshape(-1)


def form_rows(root) -> dict:
    """The consumer rows of the sample reranker's other forms, saved as train saves them: its adapter (train
    --save-adapter) and its generative form (--save-generative); tests/test_folder_forms.py trains and holds them."""
    from peft import LoraConfig, get_peft_model

    from stable_models.adapters import save_adapter
    from stable_models.consumers import folder_table
    from stable_models.generative import save_generative

    row = next(r for r in ROWS if r.sample)
    model, tokenizer = build(row, root / "reranker")
    save_generative(model, tokenizer, root / "generative", "the", "a")
    adapted = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=2, target_modules=["q_proj"]))
    save_adapter(adapted, tokenizer, root / "adapter")
    return {f"{row.name}: {form}": folder_table(root / form) for form in ("adapter", "generative")}


def embedder_row(root) -> dict:
    """The consumer rows of a tiny Qwen2 embedder (mean pooling, a tokenizer that appends eos), as it saves itself,
    and of the same with include_prompt=False; tests/test_embedding_model.py and tests/serving/test_embedding_vllm.py
    hold their cells."""
    import tiny_tokenizers
    from architectures import make_config

    from stable_models.consumers import folder_table
    from stable_models.registry import embedding_class_for
    from stable_models.tokenization import append_eos

    tokenizer = tiny_tokenizers.qwen2_like()
    append_eos(tokenizer)
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"], **WIDE, **ids), pooling="mean")
    model.save_pretrained(root / "embedder")
    tokenizer.save_pretrained(root / "embedder")
    model.config.embedding_include_prompt = False
    model.save_pretrained(root / "embedder-without-prompt")
    tokenizer.save_pretrained(root / "embedder-without-prompt")
    return {
        "embedder": folder_table(root / "embedder"),
        "embedder, include_prompt false": folder_table(root / "embedder-without-prompt"),
    }
