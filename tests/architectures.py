"""The one table of architectures every test is parametrized over, plus tiny-model and batch helpers.

Adding an architecture to the test matrix is one row in ARCHITECTURES.
"""

from dataclasses import dataclass, field

import torch
import transformers

import stable_models

PAD, EOS, BOS = 0, 1, 2
VOCAB = 96
SLIDING_WINDOW = 3  # shorter than the padding in every test batch, so the sliding-window mask paths run


@dataclass(frozen=True)
class Arch:
    name: str  # the model_type
    prefix: str  # transformers class-name prefix: {prefix}Config, {prefix}ForSequenceClassification, ...
    config_kwargs: dict = field(default_factory=dict)
    config_name: str = ""  # when not {prefix}Config
    causal_lm_name: str = ""  # when not {prefix}ForCausalLM

    @property
    def config_class(self):
        return getattr(transformers, self.config_name or f"{self.prefix}Config")

    @property
    def stock_class(self):
        return getattr(transformers, f"{self.prefix}ForSequenceClassification")

    @property
    def stable_class(self):
        return getattr(stable_models, f"Stable{self.prefix}ForSequenceClassification")

    @property
    def causal_lm_class(self):
        return getattr(transformers, self.causal_lm_name or f"{self.prefix}ForCausalLM")

    @property
    def has_sliding_window(self) -> bool:
        return "sliding_window" in self.config_kwargs

    @property
    def mixes_layer_types(self) -> bool:
        return len(set(getattr(make_config(self), "layer_types", None) or [])) > 1

    @property
    def attn_implementations(self) -> tuple[str, ...]:
        """The kernels the stock class accepts on CPU (Gemma2 refuses sdpa: it has no logit softcapping)."""
        return ("eager", "sdpa") if self.stock_class._supports_sdpa else ("eager",)

    def __str__(self) -> str:
        return self.name


ARCHITECTURES = [
    Arch("gemma", "Gemma", dict(head_dim=16)),
    Arch("gemma2", "Gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW)),
    Arch(
        "gemma3_text",
        "Gemma3Text",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
        causal_lm_name="Gemma3ForCausalLM",
    ),
    Arch("llama", "Llama"),
    Arch("mistral", "Mistral", dict(sliding_window=SLIDING_WINDOW)),
    Arch("qwen2", "Qwen2", dict(use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=1)),
    Arch("qwen3", "Qwen3", dict(use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=1)),
]

BY_NAME = {arch.name: arch for arch in ARCHITECTURES}
ARCH_ATTN = [(arch, attn) for arch in ARCHITECTURES for attn in arch.attn_implementations]
ARCH_ATTN_IDS = [f"{arch}-{attn}" for arch, attn in ARCH_ATTN]


def make_config(arch: Arch, attn: str = "eager", **overrides):
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        num_labels=3,
        attn_implementation=attn,
        **arch.config_kwargs,
    )
    kwargs.update(overrides)
    if "layer_types" in kwargs:  # repeat the pattern when a test asks for more layers
        pattern = kwargs["layer_types"]
        kwargs["layer_types"] = [pattern[i % len(pattern)] for i in range(kwargs["num_hidden_layers"])]
    return arch.config_class(**kwargs)


def make_models(arch: Arch, attn: str = "eager", dtype=torch.float32, pooling="last", seed=0, **overrides):
    """A Stable model and a stock model with identical weights, in eval mode."""
    torch.manual_seed(seed)
    stable = arch.stable_class(make_config(arch, attn, **overrides), pooling=pooling)
    # weights big enough that padding mistakes show up clearly in the logits
    with torch.no_grad():
        for param in stable.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.2)
    stock = arch.stock_class(make_config(arch, attn, **overrides))
    stock.load_state_dict(stable.state_dict())
    return stable.to(dtype).eval(), stock.to(dtype).eval()


def random_sequences(lengths, seed=0, low=3):
    """Token ids that avoid PAD/EOS/BOS unless a test puts them in on purpose."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(low, VOCAB, (n,), generator=generator) for n in lengths]


def pad_batch(sequences, side: str, pad_id: int = PAD):
    """(input_ids, attention_mask) padded to the longest sequence on `side` ("left" or "right")."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, span] = seq
        mask[row, span] = 1
    return ids, mask


def logits_alone(model, sequences, **kwargs):
    """Each sequence run on its own, without padding or mask: the reference for padding invariance."""
    with torch.no_grad():
        return torch.cat([model(seq[None], **kwargs).logits for seq in sequences])


def toy_dataset(lengths, seed):
    """Trainer examples {"input_ids": 1-D tensor, "labels": int}; a list is a valid Trainer dataset."""
    return [{"input_ids": s, "labels": i % 3} for i, s in enumerate(random_sequences(lengths, seed=seed))]


def collate_left(features):
    ids, mask = pad_batch([f["input_ids"] for f in features], "left")
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["labels"] for f in features])}


def cpu_training_args(output_dir, **overrides):
    """TrainingArguments for a short, seeded CPU run that logs every step and saves only when asked."""
    quiet = {"logging_steps": 1, "report_to": [], "use_cpu": True, "seed": 0, "save_strategy": "no"}
    return transformers.TrainingArguments(str(output_dir), **{**quiet, "remove_unused_columns": False, **overrides})
