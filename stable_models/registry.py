"""model_type -> Stable class. Adding an architecture is one row here plus one short modeling file."""

from .modeling_stable_gemma2 import StableGemma2ForSequenceClassification
from .modeling_stable_qwen2 import StableQwen2ForSequenceClassification

STABLE_CLASSES = {
    "gemma2": StableGemma2ForSequenceClassification,
    "qwen2": StableQwen2ForSequenceClassification,
}


def stable_class_for(model_type: str):
    """The Stable class for a checkpoint's `model_type`, or a ValueError listing the supported ones."""
    try:
        return STABLE_CLASSES[model_type]
    except KeyError:
        raise ValueError(
            f"stable_models has no class for model_type={model_type!r}; supported: {sorted(STABLE_CLASSES)}."
        ) from None
