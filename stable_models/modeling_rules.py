"""Which model types get a Stable class, and why the others are refused: derived from transformers' own mappings
and classes, with the few measured exceptions as data (padding that reaches real tokens, batch-coupled routers,
packing that needs a newer transformers, types built but not yet tested).

`decoder_classifier(model_type)` gives transformers' own decoder classifier or, for a causal LM without one, the
class transformers would write for it. Part of the core copied next to a checkpoint (loading rebuilds classes by name).
"""

import functools
import importlib
import inspect
import re
import sys
import typing
import warnings

from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.modeling_outputs import ModelOutput

from .modeling_checks import user_stacklevel

# Measured: padding reaches the real tokens inside the backbone (its Mamba layers), so no mask can keep padding
# invariance; these types are refused, saying why (model_type -> reason).
PADDING_REACHES_REAL_TOKENS = {
    "zamba": "padding reaches real tokens through its Mamba layers (fp64, tiny config: NaN logits with left padding)",
    "zamba2": "padding reaches real tokens through its Mamba layers (fp64, tiny config: NaN logits with left padding)",
    "deepseek_v4": (
        "its compressed attention pools keys over fixed windows of compress_rate tokens counted from the start of the "
        "row, so left padding mixes pads into the real tokens' compressed keys (tiny config, fp32: 0.37 off with left "
        "padding, 4e-7 with right)"
    ),
}


# Measured: packed batches come out wrong below a transformers release, because its masks for the model type ignore
# the position ids that separate the examples: model_type -> (first release that works, why).
PACKING_NEEDS = {
    "llama4_text": (
        (5,),
        "transformers 4.57's chunked-attention mask spans the packed examples (tiny config: 2.99 off)",
    ),
}


def transformers_version() -> tuple[int, ...]:
    version = importlib.import_module("transformers").__version__
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


# Where no wrapper can keep padding invariance: model_type -> (config flag that switches the coupling on, why).
BATCH_COUPLED = {
    "doge": (
        "is_moe",
        "its mixture-of-experts router splits router logits across all tokens of the batch (transformers' own "
        "comment: 'this split mixes router logits across tokens'), so three identical unpadded rows in one batch "
        "already get different logits",
    ),
}


# Layer kinds that carry a state along the whole row (Mamba, gated-delta and lightning linear attention): position ids
# cannot stop it at an example boundary, so packed examples would leak into each other.
RECURRENT_LAYER_KINDS = ("linear_attention", "mamba", "mamba2", "recurrent", "conv")


def recurrent_layer_kinds(config) -> list[str]:
    """The recurrent kinds among the text model's layers (`layer_types`, or Jamba's `layers_block_type`)."""
    text = config.get_text_config()
    kinds = getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None) or []
    return sorted({kind for kind in kinds if kind in RECURRENT_LAYER_KINDS})


LOCAL_WINDOWS = ("sliding_window", "attention_chunk_size")  # config fields of local attention without layer_types


def shared_prefix_obstacle(model) -> str | None:
    """Why this model cannot take packed rows whose examples share a prefix (None: it can). They need the one custom
    4D mask every layer then gets as it is, so only full attention layers, with a kernel that takes such a mask."""
    if model.config.classifier_pooling != "last":
        return "shared prefixes need last-token pooling (the prefix would count in the first example's mean)"
    kernel = model.config._attn_implementation
    if kernel not in ("eager", "sdpa"):
        return (
            f"the {kernel} attention kernel takes no custom 4D mask (load with attn_implementation='sdpa' or 'eager')"
        )
    text = model.config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or getattr(text, "attention_layers", None) or [])
    windows = [name for name in LOCAL_WINDOWS if getattr(text, name, None) is not None]
    if kinds - {"full_attention", "global"} or windows:
        kinds = "/".join(sorted(kinds - {"full_attention", "global"}) or windows)
        return (
            f"its attention kinds ({kinds}) need masks of their own, and shared prefixes give every layer one 4D mask"
        )
    if "position_ids" not in inspect.signature(model.base_model.forward).parameters:
        return "its positions come from each token's place in the row (ALiBi), not from position ids"
    return None


def warn_if_batch_coupled(model) -> None:
    """Say loudly where padding invariance (contract point 2) cannot hold, instead of claiming it."""
    flag, why = BATCH_COUPLED.get(model.config.model_type, (None, None))
    if flag and getattr(model.config, flag, False):
        warnings.warn(
            f"{type(model).__name__} with {flag}=True: the outputs of one row depend on the other rows of the batch, "
            f"because {why}. Padding invariance is impossible here; for reproducible per-text logits run one text at "
            "a time without padding (batch size 1), or use a config without it.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# Model types whose class stable_models builds, but that its tests do not run yet (no tiny config of theirs builds and
# runs there): model_type -> what stopped it. The class works as built; the guarantees are not verified, and it says so.
NOT_YET_TESTED = {
    "gemma3n": "its vision tower is a timm model, and timm needs a torchvision built for the installed torch, which "
    "the CPU test machines cannot install (its text model, gemma3n_text, is tested)",
}


def warn_if_not_yet_tested(model) -> None:
    """A class built for a model type the tests do not cover yet says so once, at construction."""
    if why := NOT_YET_TESTED.get(model.config.model_type):
        warnings.warn(
            f"{type(model).__name__}: stable_models builds this class, but its tests do not cover "
            f"model_type={model.config.model_type!r} yet ({why}), so padding invariance and parity with the stock "
            "class are not verified for it. Check them on your data (stable_models doctor) before relying on them.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


_BUILT_CLASSIFIERS = {}  # model_type -> the classifier transformers would write for a causal LM that has none


def decoder_classifier(model_type: str) -> type:
    """The decoder classifier of a model type: transformers' own (built on GenericForSequenceClassification, or an
    older one that also pools the last non-pad token: GPT-2, Pythia, OPT, BLOOM, ...), or, for a causal LM that has
    none, the class transformers would write for it (`built_classifier`). A ValueError names why a type cannot be
    classified with the contract."""
    transformers = importlib.import_module("transformers")
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    # measured, so it holds whatever class transformers gives the type (Zamba's became Generic in transformers 5.25)
    refusal = PADDING_REACHES_REAL_TOKENS.get(model_type)
    name = auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.get(model_type)
    stock = getattr(transformers, name, None) if isinstance(name, str) else None
    if not refusal and stock is not None and issubclass(stock, GenericForSequenceClassification):
        return stock
    causal_name = auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    causal = getattr(transformers, causal_name, None) if isinstance(causal_name, str) else None
    if stock is None and causal is None:
        raise ValueError(
            f"model_type={model_type!r} cannot be classified: transformers {transformers.__version__} has neither a "
            "sequence classifier nor a causal LM for it."
        )
    refusal = refusal or why_not_a_decoder(model_type, stock or causal, stock)
    if refusal:
        raise ValueError(f"model_type={model_type!r} cannot be classified with stable_models' guarantees: {refusal}.")
    return stock or built_classifier(model_type, causal)


def why_not_a_decoder(model_type: str, model_class: type, stock: type | None) -> str | None:
    """Why a model type is no decoder-only text model whose decoder layers the mask guard reaches (None: it is one).
    `model_class` is its stock classifier or, where it has none, its causal LM."""
    transformers = importlib.import_module("transformers")
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    generation = importlib.import_module("transformers.generation")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    module = sys.modules[model_class.__module__]
    if any(is_encoder_decoder(c) for c in (model_class.config_class, configs.CONFIG_MAPPING[model_type])):
        return "it is the decoder of an encoder-decoder model (it reads an encoder's output)"
    if stock is None and "is_decoder" in inspect.getsource(model_class.__init__):
        return "it is a bidirectional encoder that only its causal LM turns into a decoder (is_decoder=True)"
    backbone_name = auto.MODEL_MAPPING_NAMES.get(model_type)
    backbone = getattr(transformers, backbone_name, None) if isinstance(backbone_name, str) else None
    if backbone is None:
        return "transformers has no base model (AutoModel) for it to put a classifier on"
    type_config = configs.CONFIG_MAPPING[model_type]
    if backbone.config_class in (getattr(type_config, "sub_configs", None) or {}).values():
        return (
            f"its base model ({backbone.__name__}) is one part of a larger model (it reads the "
            f"{backbone.config_class.__name__} inside {type_config.__name__})"
        )
    if backbone.main_input_name != "input_ids":
        return f"it is not a text model (its base model reads {backbone.main_input_name})"
    if issubclass(backbone, generation.GenerationMixin):
        return (
            f"its base model ({backbone.__name__}) is a generation model whose output has no last_hidden_state; "
            "classify with its text model's type instead"
        )
    if stock is None and not hasattr(default_text_config(type_config), "hidden_size"):
        return (
            f"its config ({type_config.__name__}) names no hidden_size, the width GenericForSequenceClassification "
            "sizes `score` by (the widths live in sub-configs)"
        )
    returns = inspect.signature(backbone.forward).return_annotation
    outputs = [a for a in typing.get_args(returns) or (returns,) if isinstance(a, type) and issubclass(a, ModelOutput)]
    missing = outputs and sorted(generic_reads() - set(outputs[0].__dataclass_fields__))
    if stock is None and missing:
        return (
            f"its base model returns {outputs[0].__name__}, without the {', '.join(missing)} that "
            "GenericForSequenceClassification reads (a recurrent model without attention)"
        )
    if "attention_mask" not in inspect.signature(backbone.forward).parameters:
        return "its base model takes no attention_mask, so padding would run into its state"
    if not any(
        isinstance(value, type)
        and issubclass(value, GradientCheckpointingLayer)
        and value.__module__ == module.__name__
        for value in vars(module).values()
    ):
        return "its layers are not GradientCheckpointingLayers, so the mask guard cannot reach their attention masks"
    if stock is not None:
        if not stock.base_model_prefix:  # the Stable forward calls the backbone by that name
            return f"its classifier ({stock.__name__}) names no base_model_prefix for its backbone"
        if "pad_token_id" not in inspect.getsource(stock.forward):  # decoder classifiers find the last non-pad token
            return "its classifier is an encoder's (bidirectional attention, pooling a first or summary token)"
        if "self.score" not in inspect.getsource(stock.__init__):
            return f"its classifier head is not one linear `score` layer on the pooled token ({stock.__name__})"
    return None


@functools.cache
def generic_reads() -> set[str]:
    """The fields of the base model's output that GenericForSequenceClassification.forward reads."""
    return set(re.findall(r"transformer_outputs\.(\w+)", inspect.getsource(GenericForSequenceClassification.forward)))


def built_classifier(model_type: str, causal: type) -> type:
    """`<Name>ForSequenceClassification(GenericForSequenceClassification, <Name>PreTrainedModel)`, exactly as
    transformers writes its own (Llama, Qwen3, ...): `<Name>` from the config class, the backbone from AutoModel.
    It is defined in the model's modeling module, so transformers answers class questions as for its own classes."""
    if model_type not in _BUILT_CLASSIFIERS:
        pretrained = next(c for c in causal.__mro__ if c.__name__.endswith("PreTrainedModel"))
        config_class = importlib.import_module("transformers.models.auto.configuration_auto").CONFIG_MAPPING[model_type]
        name = config_class.__name__.removesuffix("Config") + "ForSequenceClassification"
        # the model's own backbone attribute where it names one (GPT-style models: `transformer`), so the causal LM's
        # checkpoint loads; else Generic's `model`, as in transformers' own Generic classes
        prefix = pretrained.base_model_prefix or GenericForSequenceClassification.base_model_prefix
        attributes = {"__module__": pretrained.__module__, "base_model_prefix": prefix}
        cls = type(name, (GenericForSequenceClassification, pretrained), attributes)
        cls.__qualname__ = name
        cls.config_class = config_class
        _BUILT_CLASSIFIERS[model_type] = cls
    return _BUILT_CLASSIFIERS[model_type]


def default_text_config(config_class):
    """The text part of the config class's defaults (the class itself where it needs arguments)."""
    try:
        return config_class().get_text_config()
    except Exception:  # a config that needs arguments: judge it by its class attributes
        return config_class


def is_encoder_decoder(config_class) -> bool:
    """The config's default `is_encoder_decoder` (a class attribute in transformers 5; an instance's in 4.57)."""
    flag = getattr(config_class, "is_encoder_decoder", None)
    if flag is None:
        try:
            flag = config_class().is_encoder_decoder
        except Exception:  # a config that needs arguments: not one of the seq2seq configs, which have defaults
            flag = False
    return bool(flag)


def model_type_of(classifier_name: str) -> str | None:
    """The model type whose classifier is (or would be) called `classifier_name`: transformers' own classifiers by
    name, built ones by their config class (`Gemma4TextForSequenceClassification` -> `Gemma4TextConfig`)."""
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    configs = importlib.import_module("transformers.models.auto.configuration_auto")
    for model_type, name in auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.items():
        if name == classifier_name:
            return model_type
    config_name = classifier_name.removesuffix("ForSequenceClassification") + "Config"
    for model_type, name in configs.CONFIG_MAPPING_NAMES.items():
        if name == config_name and model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return model_type
    return None
