"""stable_models: numerically stable, padding-correct decoder-LLM sequence classifiers (classifiers, reward models,
rerankers) for transformers.

`stable_models.Stable<Name>ForSequenceClassification` exists for every decoder-only text model type of the installed
transformers that the rules in `modeling_rules` accept: its stock `<Name>ForSequenceClassification` (Qwen2, Gemma2,
GPT-2, ...) or, for a causal LM without one, the classifier transformers would write for it (Gemma 4, Llama 4,
Granite, ...). `supported_model_types()` lists them; `registry.refused_model_types()` says why the others get none.
Each class is built on first use. Around them: packing collators, a Trainer that keeps weighted losses exact, the
`stable-models` commands (train / evaluate / predict / doctor) and public calibration (`calibrate`).
Importing this package changes nothing global: no transformers class or registry is patched, and no architecture's
modeling code is imported.
"""

import importlib

from . import modeling_stable
from .calibration import calibrate
from .modeling_loss import Fp32Linear
from .modeling_pooling import POOLING_MODES
from .modeling_stable import StableSequenceClassificationMixin
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
from .verify import check_checkpoint, verify_folder

__version__ = "0.2.0"


# imported on first use: they subclass transformers' Trainer and TrainerCallback, whose import pulls in peft,
# accelerate and bitsandbytes (seconds, and bitsandbytes may print to stderr)
LAZY = {
    "StableTrainer": "trainer",
    "PairwiseTrainer": "trainer",
    "NonFiniteError": "training",
    "NonFiniteGuard": "training",
    "StopOnNonFinite": "training",
}


def __getattr__(name: str):
    """`stable_models.StableQwen3MoeForSequenceClassification` and the like, built on first use; the trainer and
    training callbacks imported on first use."""
    if name in LAZY:
        return getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    return getattr(modeling_stable, name)


__all__ = [
    "POOLING_MODES",
    "STABLE_CLASSES",
    "Fp32Linear",
    "NonFiniteError",
    "NonFiniteGuard",
    "PackedCollator",
    "PackedPairCollator",
    "PairwiseTrainer",
    "StableSequenceClassificationMixin",
    "StableTrainer",
    "StopOnNonFinite",
    "bradley_terry_loss",
    "calibrate",
    "check_checkpoint",
    "from_pretrained",
    "get_reward",
    "register",
    "registered",
    "setup_pad_token",
    "stable_class_for",
    "supported_model_types",
    "unregister",
    "verify_folder",
]
