"""model_type -> Stable class, and opt-in registration with AutoModelForSequenceClassification.

Derived from transformers' own mappings through `modeling_rules.decoder_classifier`: every decoder-only text model type
gets a class (its stock decoder classifier, or the one transformers would write for a causal LM without one); nothing
here is per architecture. Classes are built on first use, so `import stable_models` imports no architecture's modeling
code.
"""

import contextlib
import functools
import json
import os
from collections.abc import Mapping

import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification
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
    """Load any supported checkpoint as its Stable class, picked by model_type: a base CausalLM (also from a GGUF
    file, `gguf_file=`), a classifier, or a peft adapter folder (adapter_config.json, no config.json), which loads
    its base and then the adapter."""
    path = pretrained_model_name_or_path
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(
        os.path.join(path, "config.json")
    ):
        return from_adapter_folder(path, **kwargs)
    where = {key: kwargs[key] for key in ("gguf_file", "subfolder", "revision") if kwargs.get(key)}
    config = AutoConfig.from_pretrained(path, trust_remote_code=False, **where)
    return stable_class_for(config.model_type).from_pretrained(path, **kwargs)


def from_adapter_folder(folder, **kwargs):
    """Base model from adapter_config.json's `base_model_name_or_path` (num_labels from the saved head when not
    given), then `PeftModel.from_pretrained`; a clear error when the base cannot be found locally."""
    from peft import PeftModel

    with open(os.path.join(folder, "adapter_config.json")) as handle:
        base = json.load(handle).get("base_model_name_or_path")
    how = (
        f"load the base yourself and add the adapter: model = stable_models.from_pretrained(base_folder, "
        f"num_labels=...); model = peft.PeftModel.from_pretrained(model, {str(folder)!r})"
    )
    if not base:
        raise ValueError(f"{folder}: adapter_config.json names no base_model_name_or_path; {how}.")
    try:
        config = AutoConfig.from_pretrained(base, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{folder}: the adapter's base model {base!r} (adapter_config.json, base_model_name_or_path) cannot be "
            f"loaded here ({str(error).splitlines()[0]}). Put the base checkpoint at that path or set the field to a "
            f"local copy, or {how}."
        ) from None
    if "num_labels" not in kwargs and (labels := saved_head_rows(folder)):
        kwargs["num_labels"] = labels
    model = stable_class_for(config.model_type).from_pretrained(base, **kwargs)
    return PeftModel.from_pretrained(model, folder)


def saved_head_rows(folder) -> int | None:
    """Rows of the `score` weight a SEQ_CLS adapter saved (peft keeps the trained head in modules_to_save)."""
    from safetensors import safe_open

    path = os.path.join(folder, "adapter_model.safetensors")
    if not os.path.isfile(path):
        return None
    with safe_open(path, "pt") as weights:
        for key in weights.keys():
            if key.endswith("score.weight"):
                return weights.get_slice(key).get_shape()[0]
    return None


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
