"""model_type -> Stable class, and opt-in registration with AutoModelForSequenceClassification.

Derived from transformers' own mappings through `modeling_rules.decoder_classifier`: every decoder-only text model type
gets a class (its stock decoder classifier, or the one transformers would write for a causal LM without one); nothing
here is per architecture. Classes are built on first use, so `import stable_models` imports no architecture's modeling
code.
"""

import contextlib
import functools
from collections.abc import Mapping

import transformers
from transformers import AutoModelForSequenceClassification
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)

from .modeling_rules import decoder_classifier
from .modeling_stable import stable_class

_MAPPING = AutoModelForSequenceClassification._model_mapping
_SAVED = {}  # config class -> what the mapping's extra content held before register() (None: nothing)


def _stock_class(model_type: str):
    """The stock decoder classifier of a model type; None if it has none."""
    try:
        return decoder_classifier(model_type)
    except ValueError:
        return None


@functools.cache
def supported_model_types() -> tuple[str, ...]:
    """Every model type of the installed transformers that has a Stable class (imports each modeling module once)."""
    candidates = set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES) | set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return tuple(sorted(t for t in candidates if _stock_class(t) is not None))


@functools.cache
def refused_model_types() -> dict[str, str]:
    """Every causal-LM or classifier model type of the installed transformers without a Stable class: the reason."""
    refused = {}
    for model_type in sorted(
        set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES) | set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    ):
        try:
            decoder_classifier(model_type)
        except ValueError as error:
            refused[model_type] = str(error).split(": ", 1)[-1]
        except Exception as error:  # a modeling module that does not import here (a missing optional dependency)
            refused[model_type] = f"its modeling code does not import here ({type(error).__name__}: {error})"
    return refused


def stable_class_for(model_type: str):
    """The Stable class for a checkpoint's `model_type`, or a ValueError that says why there is none."""
    try:
        stock = decoder_classifier(model_type)
    except ValueError as error:
        raise ValueError(
            f"stable_models has no class for model_type={model_type!r} with transformers {transformers.__version__}: "
            f"{str(error).split(': ', 1)[-1]} Supported: {', '.join(supported_model_types())}."
        ) from None
    return stable_class(stock)


def embedding_class_for(model_type: str):
    """The Stable embedder (`modeling_embedding`) for a checkpoint's `model_type`: its Stable classifier without the
    head; a ValueError that says why where there is none."""
    from .modeling_embedding import embedding_class

    return embedding_class(stable_class_for(model_type))


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
