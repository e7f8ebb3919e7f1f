"""The one table of architectures every test is parametrized over, plus tiny-model and batch helpers.

Adding an architecture to the test matrix is one row in ARCHITECTURES.
"""

from dataclasses import dataclass, field

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma2ForSequenceClassification,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from stable_models import StableGemma2ForSequenceClassification, StableQwen2ForSequenceClassification

PAD, EOS, BOS = 0, 1, 2
VOCAB = 96
SLIDING_WINDOW = 3  # shorter than the padding in every test batch, so the sliding-window mask paths run


@dataclass(frozen=True)
class Arch:
    name: str
    config_class: type
    stock_class: type
    stable_class: type
    causal_lm_class: type
    config_kwargs: dict = field(default_factory=dict)

    @property
    def attn_implementations(self) -> tuple[str, ...]:
        """The kernels the stock class accepts on CPU (Gemma2 refuses sdpa: it has no logit softcapping)."""
        return ("eager", "sdpa") if self.stock_class._supports_sdpa else ("eager",)

    def __str__(self) -> str:
        return self.name


ARCHITECTURES = [
    Arch(
        "gemma2",
        Gemma2Config,
        Gemma2ForSequenceClassification,
        StableGemma2ForSequenceClassification,
        Gemma2ForCausalLM,
        dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW),
    ),
    Arch(
        "qwen2",
        Qwen2Config,
        Qwen2ForSequenceClassification,
        StableQwen2ForSequenceClassification,
        Qwen2ForCausalLM,
        dict(use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=1),
    ),
]

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
