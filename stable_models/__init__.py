"""stable_models: numerically stable, padding-correct decoder LLM sequence classifiers for transformers.

`stable_models.Stable<Name>ForSequenceClassification` exists for every transformers decoder classifier
`<Name>ForSequenceClassification` built on GenericForSequenceClassification (Qwen2, Gemma2, Llama, Mixtral, Phi3, ...);
each is built on first use. Importing this package changes nothing global: no transformers class or registry is
patched, and no architecture's modeling code is imported.
"""

from . import modeling_stable
from .modeling_stable import POOLING_MODES, Fp32Linear, StableSequenceClassificationMixin, check_checkpoint
from .packing import PackedCollator, PackedPairCollator, bradley_terry_loss
from .registry import (
    STABLE_CLASSES,
    from_pretrained,
    register,
    registered,
    stable_class_for,
    supported_model_types,
    unregister,
)
from .reward import get_reward
from .tokenization import setup_pad_token
from .training import NonFiniteError, NonFiniteGuard, StopOnNonFinite

__version__ = "0.2.0"


def __getattr__(name: str):
    """`stable_models.StableQwen3MoeForSequenceClassification` and the like, built on first use; `StableTrainer`
    imported on first use (transformers' Trainer is slow to import)."""
    if name == "StableTrainer":
        from .trainer import StableTrainer

        return StableTrainer
    return getattr(modeling_stable, name)


__all__ = [
    "POOLING_MODES",
    "STABLE_CLASSES",
    "Fp32Linear",
    "NonFiniteError",
    "NonFiniteGuard",
    "PackedCollator",
    "PackedPairCollator",
    "StableSequenceClassificationMixin",
    "StableTrainer",
    "StopOnNonFinite",
    "bradley_terry_loss",
    "check_checkpoint",
    "from_pretrained",
    "get_reward",
    "register",
    "registered",
    "setup_pad_token",
    "stable_class_for",
    "supported_model_types",
    "unregister",
]
