"""stable_models: numerically stable, padding-correct decoder LLM sequence classifiers for transformers.

Importing this package changes nothing global: no transformers class or registry is patched.
"""

from .modeling_stable import POOLING_MODES, Fp32Linear, StableSequenceClassificationMixin, check_checkpoint
from .modeling_stable_gemma2 import StableGemma2ForSequenceClassification
from .modeling_stable_qwen2 import StableQwen2ForSequenceClassification
from .registry import STABLE_CLASSES, register, registered, stable_class_for, unregister

__version__ = "0.1.0"

__all__ = [
    "POOLING_MODES",
    "STABLE_CLASSES",
    "Fp32Linear",
    "StableGemma2ForSequenceClassification",
    "StableQwen2ForSequenceClassification",
    "StableSequenceClassificationMixin",
    "check_checkpoint",
    "register",
    "registered",
    "stable_class_for",
    "unregister",
]
