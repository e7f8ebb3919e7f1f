"""model_type -> Stable class, derived from transformers' own sequence-classification mapping, and opt-in
registration with AutoModelForSequenceClassification.

Every model type whose stock `*ForSequenceClassification` is built on `GenericForSequenceClassification` gets a Stable
class; nothing here is per architecture. Classes are built on first use, so `import stable_models` imports no
architecture's modeling code.
"""

import contextlib
import functools
from collections.abc import Mapping

import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification
from transformers.modeling_layers import GenericForSequenceClassification
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

from .modeling_stable import stable_class

_MAPPING = AutoModelForSequenceClassification._model_mapping
_SAVED = {}  # config class -> what the mapping's extra content held before register() (None: nothing)


def _stock_class(model_type: str):
    """The stock decoder classifier of a model type; None if unknown or not a GenericForSequenceClassification."""
    name = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(model_type)
    stock = getattr(transformers, name, None) if isinstance(name, str) else None
    return stock if isinstance(stock, type) and issubclass(stock, GenericForSequenceClassification) else None


@functools.cache
def supported_model_types() -> tuple[str, ...]:
    """Every model type of the installed transformers that has a Stable class (imports each modeling module once)."""
    return tuple(sorted(t for t in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES if _stock_class(t) is not None))


def stable_class_for(model_type: str):
    """The Stable class for a checkpoint's `model_type`, or a ValueError listing the supported ones."""
    stock = _stock_class(model_type)
    if stock is None:
        raise ValueError(
            f"stable_models has no class for model_type={model_type!r} with transformers {transformers.__version__}: "
            "only decoder classifiers built on GenericForSequenceClassification are covered; supported: "
            f"{', '.join(supported_model_types())}."
        )
    return stable_class(stock)


class _StableClasses(Mapping):
    """Read-only `{model_type: Stable class}` for every supported model type; a class is built when looked up."""

    def __getitem__(self, model_type):
        if _stock_class(model_type) is None:
            raise KeyError(model_type)
        return stable_class_for(model_type)

    def __iter__(self):
        return iter(supported_model_types())

    def __len__(self):
        return len(supported_model_types())


STABLE_CLASSES = _StableClasses()


def from_pretrained(pretrained_model_name_or_path, **kwargs):
    """Load any supported checkpoint (a base CausalLM or a classifier) as its Stable class, picked by model_type."""
    config = AutoConfig.from_pretrained(pretrained_model_name_or_path, trust_remote_code=False)
    return stable_class_for(config.model_type).from_pretrained(pretrained_model_name_or_path, **kwargs)


def register(*model_types: str) -> None:
    """Make AutoModelForSequenceClassification build Stable classes in this process (for the given model types, or
    all supported ones, which imports every architecture's modeling code). Idempotent; undo: unregister().

    Two lines fix an existing script: `import stable_models; stable_models.register()`.
    """
    for model_type in model_types or supported_model_types():
        cls = stable_class_for(model_type)
        config_class = cls.config_class
        if config_class not in _SAVED:
            _SAVED[config_class] = _MAPPING._extra_content.get(config_class)
        AutoModelForSequenceClassification.register(config_class, cls, exist_ok=True)


def unregister() -> None:
    """Restore what AutoModelForSequenceClassification built before register(). Idempotent."""
    for config_class, previous in list(_SAVED.items()):
        if previous is None:
            _MAPPING._extra_content.pop(config_class, None)
        else:
            _MAPPING._extra_content[config_class] = previous
        del _SAVED[config_class]


@contextlib.contextmanager
def registered(*model_types: str):
    """`with stable_models.registered(): ...` registers the Stable classes for the block only."""
    already = bool(_SAVED)
    register(*model_types)
    try:
        yield
    finally:
        if not already:
            unregister()
