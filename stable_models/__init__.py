"""stable_models: numerically stable, padding-correct decoder LLM sequence classifiers for transformers.

Importing this package changes nothing global: no transformers class or registry is patched.
"""

from .modeling_stable import POOLING_MODES, Fp32Linear, StableSequenceClassificationMixin, check_checkpoint
from .modeling_stable_gemma import StableGemmaForSequenceClassification
from .modeling_stable_gemma2 import StableGemma2ForSequenceClassification
from .modeling_stable_gemma3_text import StableGemma3TextForSequenceClassification
from .modeling_stable_llama import StableLlamaForSequenceClassification
from .modeling_stable_mistral import StableMistralForSequenceClassification
from .modeling_stable_qwen2 import StableQwen2ForSequenceClassification
from .modeling_stable_qwen3 import StableQwen3ForSequenceClassification
from .packing import PackedCollator
from .registry import STABLE_CLASSES, from_pretrained, register, registered, stable_class_for, unregister
from .tokenization import setup_pad_token
from .training import NonFiniteError, NonFiniteGuard, StopOnNonFinite

__version__ = "0.1.0"

__all__ = [
    "POOLING_MODES",
    "STABLE_CLASSES",
    "Fp32Linear",
    "NonFiniteError",
    "NonFiniteGuard",
    "PackedCollator",
    "StableGemma2ForSequenceClassification",
    "StableGemma3TextForSequenceClassification",
    "StableGemmaForSequenceClassification",
    "StableLlamaForSequenceClassification",
    "StableMistralForSequenceClassification",
    "StableQwen2ForSequenceClassification",
    "StableQwen3ForSequenceClassification",
    "StableSequenceClassificationMixin",
    "StopOnNonFinite",
    "check_checkpoint",
    "from_pretrained",
    "register",
    "registered",
    "setup_pad_token",
    "stable_class_for",
    "unregister",
]
