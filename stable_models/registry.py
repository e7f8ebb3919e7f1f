"""model_type -> Stable class, and opt-in registration with transformers' AutoModelForSequenceClassification.

Adding an architecture is one row in STABLE_CLASSES plus one short modeling file.
"""

import contextlib

from transformers import AutoConfig, AutoModelForSequenceClassification

from .modeling_stable_gemma import StableGemmaForSequenceClassification
from .modeling_stable_gemma2 import StableGemma2ForSequenceClassification
from .modeling_stable_gemma3_text import StableGemma3TextForSequenceClassification
from .modeling_stable_llama import StableLlamaForSequenceClassification
from .modeling_stable_mistral import StableMistralForSequenceClassification
from .modeling_stable_qwen2 import StableQwen2ForSequenceClassification
from .modeling_stable_qwen3 import StableQwen3ForSequenceClassification

STABLE_CLASSES = {
    "gemma": StableGemmaForSequenceClassification,
    "gemma2": StableGemma2ForSequenceClassification,
    "gemma3_text": StableGemma3TextForSequenceClassification,
    "llama": StableLlamaForSequenceClassification,
    "mistral": StableMistralForSequenceClassification,
    "qwen2": StableQwen2ForSequenceClassification,
    "qwen3": StableQwen3ForSequenceClassification,
}
_MAPPING = AutoModelForSequenceClassification._model_mapping
_SAVED = {}  # config class -> what the mapping's extra content held before register() (None: nothing)


def stable_class_for(model_type: str):
    """The Stable class for a checkpoint's `model_type`, or a ValueError listing the supported ones."""
    try:
        return STABLE_CLASSES[model_type]
    except KeyError:
        raise ValueError(
            f"stable_models has no class for model_type={model_type!r}; supported: {sorted(STABLE_CLASSES)}."
        ) from None


def from_pretrained(pretrained_model_name_or_path, **kwargs):
    """Load any supported checkpoint (a base CausalLM or a classifier) as its Stable class, picked by model_type."""
    config = AutoConfig.from_pretrained(pretrained_model_name_or_path, trust_remote_code=False)
    return stable_class_for(config.model_type).from_pretrained(pretrained_model_name_or_path, **kwargs)


def register() -> None:
    """Make AutoModelForSequenceClassification build Stable classes in this process. Idempotent; undo: unregister().

    Two lines fix an existing script: `import stable_models; stable_models.register()`.
    """
    for stable_class in STABLE_CLASSES.values():
        config_class = stable_class.config_class
        if config_class not in _SAVED:
            _SAVED[config_class] = _MAPPING._extra_content.get(config_class)
        AutoModelForSequenceClassification.register(config_class, stable_class, exist_ok=True)


def unregister() -> None:
    """Restore what AutoModelForSequenceClassification built before register(). Idempotent."""
    for config_class, previous in list(_SAVED.items()):
        if previous is None:
            _MAPPING._extra_content.pop(config_class, None)
        else:
            _MAPPING._extra_content[config_class] = previous
        del _SAVED[config_class]


@contextlib.contextmanager
def registered():
    """`with stable_models.registered(): ...` registers the Stable classes for the block only."""
    already = bool(_SAVED)
    register()
    try:
        yield
    finally:
        if not already:
            unregister()
