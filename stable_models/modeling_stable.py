"""The Stable classes: `StableSequenceClassificationMixin` put before a transformers `*ForSequenceClassification`,
built by name on first use (`stable_class`, module `__getattr__`), and its forward.

The mixin replaces `forward`, makes the `score` head fp32, guards the mask every decoder layer receives, checks a local
folder in `from_pretrained` and writes the engines' files and a model card in `save_pretrained`; weights, attributes
and outputs stay the stock ones. save_pretrained copies this file and its `modeling_*` siblings next to the checkpoint
(remote code), so the core imports only torch, transformers and those siblings.
"""

import logging
import os
import warnings

import torch
from transformers.dynamic_module_utils import custom_object_save
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import SequenceClassifierOutputWithPast
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils.generic import TransformersKwargs, can_return_tuple

from .modeling_checks import check_inputs, user_stacklevel, warn_if_longer_than_positions, warn_if_padded_without_mask
from .modeling_files import (
    INSTALLED_LOAD,
    MODEL_CARD,
    NO_PAD_TOKEN_ID,
    card_kind,
    check_saved_folder,
    name_the_stock_architecture,
    record_code_files,
    tokenizer_pad_token_id,
    write_pooling_files,
)
from .modeling_loss import Fp32Linear, checked_loss_options, sequence_classification_loss
from .modeling_masks import LayerMaskGuard, position_ids_from_mask, shared_prefix_mask
from .modeling_pooling import (
    DEFAULT_POOLING,
    POOLING_MODES,
    in_feature_order,
    packed_examples,
    packed_without_leading,
    pool,
    pool_packed,
    without_leading,
)
from .modeling_precision import LOW_PRECISION_ADVICE, initialize_gathered, low_precision_trainables
from .modeling_rules import (
    PACKING_NEEDS,
    decoder_classifier,
    model_type_of,
    recurrent_layer_kinds,
    shared_prefix_obstacle,
    transformers_version,
    warn_if_batch_coupled,
    warn_if_not_yet_tested,
)

STABLE_PREFIX = "Stable"


class HideFalsePipelineError(logging.Filter):
    """transformers' pipeline checks the model's class *name* against the stock classes and logs at error level
    "The model 'StableQwen2ForSequenceClassification' is not supported for text-classification" although it is.
    This filter drops exactly that record for Stable classes; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(f"The model '{STABLE_PREFIX}") and "is not supported for" in message)


def hide_false_pipeline_error() -> None:
    """Install the filter on transformers' pipeline logger once, when the first Stable model is built."""
    logger = logging.getLogger("transformers.pipelines.base")
    if not any(isinstance(f, HideFalsePipelineError) for f in logger.filters):
        logger.addFilter(HideFalsePipelineError())


class StableSequenceClassificationMixin:
    """Put before a stock `*ForSequenceClassification` class: same constructor, weights, attributes and outputs.

    `pooling` ("last" or "mean") is a constructor / `from_pretrained` argument and is saved in `config.json` as
    `classifier_pooling`. So are the loss options, saved under their own names: `class_weights` (one per label) and
    `label_smoothing` for single-label classification, `pos_weight` (one per label) for multi-label.
    """

    _keep_in_fp32_modules_strict = ["score"]
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch, and the loss honours it

    def __init__(
        self, config, *args, pooling=None, class_weights=None, label_smoothing=None, pos_weight=None, **kwargs
    ):
        pooling = pooling or getattr(config, "classifier_pooling", None) or DEFAULT_POOLING
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling={pooling!r} is not supported; use one of {POOLING_MODES}.")
        options = checked_loss_options(config, class_weights, label_smoothing, pos_weight)
        config.classifier_pooling = pooling
        for name, value in options.items():
            if value is not None or hasattr(config, name):
                setattr(config, name, value)
        super().__init__(config, *args, **kwargs)
        self._warned_weighted_by_count = False
        self.score.__class__ = Fp32Linear  # same parameters and state-dict keys; only forward and dtype change
        self.score.float()
        text_config = config.get_text_config()
        if text_config is not config:  # multimodal configs: the text part answers num_labels questions too
            text_config.num_labels = config.num_labels
            text_config.problem_type = config.problem_type
        self._mask_guard = LayerMaskGuard()
        layers = [m for m in self.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise TypeError(f"{type(self).__name__}: found no decoder layers to guard the attention masks of.")
        for layer in layers:
            layer.register_forward_pre_hook(self._mask_guard, with_kwargs=True)
        warn_if_batch_coupled(self)
        warn_if_not_yet_tested(self)
        hide_false_pipeline_error()

    @classmethod
    def stock_class(cls) -> type:
        """The transformers class this Stable class extends: the first class in the MRO that is not a Stable one."""
        return next(
            c
            for c in cls.__mro__
            if c.__name__.endswith("ForSequenceClassification") and not issubclass(c, StableSequenceClassificationMixin)
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The stock loader, after checking a local folder so that a broken one fails with a clear message."""
        if (
            isinstance(pretrained_model_name_or_path, (str, os.PathLike))
            and os.path.isdir(pretrained_model_name_or_path)
            and not kwargs.get("gguf_file")  # the weights and config are in that file
        ):
            subfolder = kwargs.get("subfolder") or ""
            check_saved_folder(
                os.path.join(pretrained_model_name_or_path, subfolder),
                require_auto_map=False,
                pooling=kwargs.get("pooling"),
            )
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if not is_deepspeed_zero3_enabled():
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        wants_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        if any(key.split(".")[-2:-1] == ["score"] for key in info["missing_keys"]):
            initialize_gathered(model, model.score)
        return (model, info) if wants_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """The stock save (which also writes auto_map and copies this code), with the stock class's name in
        `architectures` (serving engines pick their implementation by it; transformers with trust_remote_code follows
        auto_map to the Stable class), the pad_token_id serving engines need (from a tokenizer next to the model or
        where it came from), the pooling files vLLM reads for a mean pooled checkpoint, and a model card."""
        main_process = kwargs.get("is_main_process", True)
        configs = {id(c): c for c in (self.config, self.config.get_text_config())}.values()
        pads = [getattr(c, "pad_token_id", None) for c in configs]  # a multimodal top level may have none at all
        if main_process and None in pads:
            pad = next((p for p in pads if p is not None), None)
            pad = pad if pad is not None else tokenizer_pad_token_id(save_directory, self.config._name_or_path)
            if pad is None and not getattr(self, "_warned_no_pad_token_id", False):
                self._warned_no_pad_token_id = True  # once, not at every Trainer checkpoint
                warnings.warn(
                    NO_PAD_TOKEN_ID.format(name=type(self).__name__, folder=str(save_directory)),
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            for config in configs:
                if pad is not None and getattr(config, "pad_token_id", None) is None:
                    config.pad_token_id = pad
        if main_process and type(self)._auto_class is not None:  # is_remote_code() answers False, as for the stock
            os.makedirs(save_directory, exist_ok=True)  # class, so the stock save no longer copies the code itself
            custom_object_save(self, save_directory, config=self.config)
        super().save_pretrained(save_directory, *args, **kwargs)
        if not main_process:
            return
        self.config.architectures = [self.stock_class().__name__]
        name_the_stock_architecture(str(save_directory), self.config.architectures[0])
        record_code_files(str(save_directory))
        write_pooling_files(
            str(save_directory), self.config.classifier_pooling, self.config.get_text_config().hidden_size
        )
        card = os.path.join(save_directory, "README.md")
        if not os.path.exists(card):
            stock = self.stock_class()
            with open(card, "w") as handle:
                handle.write(
                    MODEL_CARD.format(
                        name=type(self).__name__,
                        stock=stock.__name__,
                        pooling=self.config.classifier_pooling,
                        kind=card_kind(self.config)[0],
                        tag=card_kind(self.config)[1],
                        installed_load=INSTALLED_LOAD,
                        auto_class="AutoModelForSequenceClassification",
                    )
                )

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        num_items_in_batch=None,
        **kwargs: Unpack[TransformersKwargs],  # as the stock forward: tools read output_attentions & co. from it
    ):
        label_weight_total = kwargs.pop("label_weight_total", None)  # StableTrainer: class weights of the whole batch
        pooled, outputs = pooled_states(
            self, input_ids, attention_mask, position_ids, inputs_embeds, labels, use_cache, kwargs
        )
        logits = self.score(pooled)

        loss = None
        if labels is not None:
            loss = sequence_classification_loss(
                logits, labels, self.config, num_items_in_batch, label_weight_total, model=self
            )
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{name: value for name, value in outputs.items() if name in ("cache", "past_key_values")},
        )


def pooled_states(
    model, input_ids, attention_mask, position_ids, inputs_embeds, labels, use_cache, kwargs, leading=None
):
    """(the pooled hidden state of each example, the backbone's outputs): the call checked, packed or padded rows
    prepared, the backbone run under the mask guard, and pooling by the mask (fp32). `leading`: per example (or one
    for all), how many of its first tokens pooling leaves out (an embedder's prompt)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
    # under torch.compile, torch.export or a tracing exporter (torch.onnx.export(dynamo=False), optimum) the
    # data-dependent checks and shortcuts would break the graph or be frozen into it as constants: skip them
    tracing = torch.jit.is_tracing()
    compiling = torch.compiler.is_compiling() or tracing
    if (tracing or getattr(torch.compiler, "is_exporting", bool)()) and (
        position_ids is not None or "packed_example_index" in kwargs
    ):
        raise ValueError(
            f"{type(model).__name__}: export or trace with input_ids and attention_mask only. An exported graph "
            "cannot tell a packed batch (position_ids restarting per example) from a padded one, so it would pool "
            "one example per row; the Stable forward derives the positions of a padded batch from the mask."
        )
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    past_length = 0 if cache is None else cache.get_seq_length()
    if not compiling:
        check_call(model, input_ids, attention_mask, inputs_embeds, labels, past_length)
    query_length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
    example_index = kwargs.pop("packed_example_index", None)
    example_ids, position_ids, backbone_mask, padding_mask = prepared_rows(
        model, attention_mask, position_ids, cache, compiling, query_length
    )
    if not compiling:
        warn_if_longer_than_positions(model, query_length + past_length, position_ids, padding_mask)

    model._mask_guard.cache.clear()
    model._mask_guard.past_length = past_length
    try:
        outputs = getattr(model, model.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=backbone_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=bool(use_cache),
            **kwargs,
        )
    finally:
        model._mask_guard.cache.clear()
        model._mask_guard.past_length = 0
    query_mask = None if padding_mask is None else padding_mask[:, -query_length:]
    if leading is not None:
        hidden = outputs.last_hidden_state
        examples = hidden.shape[0] if example_ids is None else int(example_ids.max()) + 1
        leading = torch.as_tensor(leading, dtype=torch.long, device=hidden.device).reshape(-1).expand(examples)
        if example_index is not None:  # the features' counts in row-major order: example k is feature example_index[k]
            leading = leading[example_index.to(leading.device)]
        if example_ids is not None:
            example_ids = packed_without_leading(example_ids, position_ids, leading)
        else:
            real = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
            query_mask = without_leading(real if query_mask is None else query_mask, leading)
    if example_ids is not None:
        pooled = pool_packed(outputs.last_hidden_state, example_ids, model.config.classifier_pooling)
    else:
        pooled = pool(outputs.last_hidden_state, query_mask, model.config.classifier_pooling)
    if example_index is not None:  # back to the order of the features (rows of one example each: the same)
        pooled = in_feature_order(pooled, example_index)
    if outputs.last_hidden_state.dtype == torch.float16 and not compiling and not torch.isfinite(pooled).all():
        raise ValueError(
            f"{type(model).__name__} overflowed in float16: an activation exceeded 65504 (Gemma, Qwen and other "
            "recent models have activations above it). Load the model with dtype=torch.bfloat16 (same range "
            "as fp32) or torch.float32; train with bf16=True instead of fp16=True."
        )
    return pooled, outputs


def prepared_rows(model, attention_mask, position_ids, cache, compiling, query_length):
    """(packed example ids or None, position ids, the mask the backbone gets, the padding mask or None): packed rows
    become examples with no mask; an unpadded batch takes the plain causal path; left padding gets positions from the
    mask (right padding alone leaves the default 0, 1, 2, ... right)."""
    padding_mask = None if attention_mask is None else attention_mask != 0
    example_ids = None
    if position_ids is not None and cache is None:  # under torch.compile: a graph break, exact results
        packed = packed_batch(model, position_ids, padding_mask)
        if packed is not None:
            example_ids, position_ids, attention_mask = packed
            padding_mask = None
    if padding_mask is not None and cache is None and not compiling and padding_mask.all():
        padding_mask = None  # nothing is padded: the plain causal path is exact and fastest
    if padding_mask is not None:  # the backbone builds the masks each layer needs from it; the guard fixes them
        left_padded = compiling or cache is not None or not padding_mask[:, 0].all()
        if position_ids is None and left_padded:
            position_ids = position_ids_from_mask(padding_mask, query_length)
    return example_ids, position_ids, attention_mask, padding_mask


def check_call(model, input_ids, attention_mask, inputs_embeds, labels, past_length) -> None:
    """The checks of a call that read its values (skipped while compiling or tracing): bad input is a ValueError,
    a padded batch without a mask and low-precision trainable weights (once, at the first training step) warn."""
    check_inputs(model, input_ids, attention_mask, inputs_embeds, labels, past_length)
    if attention_mask is None and input_ids is not None:
        warn_if_padded_without_mask(model, input_ids)
    if model.training and torch.is_grad_enabled() and not getattr(model, "_low_precision_checked", False):
        model._low_precision_checked = True
        if found := low_precision_trainables(model):
            (example, dtype) = found[0]
            advice = LOW_PRECISION_ADVICE.format(count=len(found), example=example, dtype=dtype)
            warnings.warn(advice, UserWarning, stacklevel=user_stacklevel())


def packed_batch(model, position_ids, padding_mask):
    """A packed batch (stable_models.PackedCollator: position ids restart at each example, rows may end in
    padding) as (each token's example, position ids, the backbone's mask), or None for a padded batch. The
    backbone gets no mask, so transformers builds block-diagonal masks from the position ids (the padding at the
    end of a row is a block of its own), and pooling works per example; where examples continue a prefix they
    share, it gets the tree mask instead. Refuses what packing cannot serve exactly."""
    packed = packed_examples(position_ids, padding_mask)
    if packed is None:
        return None
    if kinds := recurrent_layer_kinds(model.config):
        raise ValueError(
            f"{type(model).__name__} has {'/'.join(kinds)} layers, whose state runs along the whole row: in "
            "a packed batch each example would see the ones before it. Pad instead of packing (a plain "
            "DataCollatorWithPadding); padding keeps every guarantee for this model."
        )
    if (need := PACKING_NEEDS.get(model.config.model_type)) and transformers_version() < need[0]:
        raise ValueError(
            f"{type(model).__name__}: packed batches need transformers >= {'.'.join(map(str, need[0]))} "
            f"for this model type ({need[1]}). Upgrade transformers, or pad instead of packing "
            "(DataCollatorWithPadding)."
        )
    example_ids, position_ids, shares_prefixes = packed
    if not shares_prefixes:
        return example_ids, position_ids, None
    if why := shared_prefix_obstacle(model):  # examples continue a prefix they share: the tree mask
        raise ValueError(
            f"{type(model).__name__}: this packed batch shares prefixes between examples (position ids "
            f"continue from a shared prefix), but {why}. Pack without shared prefixes "
            "(PackedGroupCollator(share_prefixes=False))."
        )
    dtype = model.get_input_embeddings().weight.dtype
    return example_ids, position_ids, shared_prefix_mask(position_ids, dtype)


# Class questions transformers answers from the defining module's source or from `_auto_class` (set by
# register_for_auto_class so that save_pretrained copies this code). Asked of a Stable class they would describe this
# file: experts / attention kernels judged from its text (grouped_mm refused for MoE), and the custom-code loading path
# (missing weights left uninitialised, checkpoint conversions skipped). The stock class answers them instead; the ones
# this transformers release does not ask are not defined.
STOCK_CLASS_QUESTIONS = (
    "_can_set_attn_implementation",
    "_can_set_experts_implementation",
    "is_custom_code",
    "is_remote_code",
)


def ask_the_stock_class(question: str) -> classmethod:
    return classmethod(lambda cls: getattr(cls.stock_class(), question)())


for _question in STOCK_CLASS_QUESTIONS:
    if hasattr(PreTrainedModel, _question):
        setattr(StableSequenceClassificationMixin, _question, ask_the_stock_class(_question))


_STABLE_CLASSES = {}  # stock class -> Stable class, built once


def stable_class(stock_class):
    """The Stable class for a decoder classifier (from `decoder_classifier`): the mixin put before it, nothing else.

    The class lives in this module (`__module__`), so `save_pretrained` copies this one file and writes
    `auto_map = modeling_stable.Stable<Name>`, which `__getattr__` below rebuilds wherever the folder is loaded.
    """
    if not (isinstance(stock_class, type) and stock_class.__name__.endswith("ForSequenceClassification")):
        raise TypeError(f"{stock_class!r} is not a *ForSequenceClassification class; see decoder_classifier().")
    if stock_class not in _STABLE_CLASSES:
        name = STABLE_PREFIX + stock_class.__name__
        cls = type(
            name,
            (StableSequenceClassificationMixin, stock_class),
            {
                "__module__": __name__,
                "__doc__": (
                    f"`{stock_class.__name__}` with the stable_models contract (see StableSequenceClassificationMixin)."
                ),
            },
        )
        cls.__qualname__ = name
        cls.register_for_auto_class("AutoModelForSequenceClassification")
        _STABLE_CLASSES[stock_class] = cls
    return _STABLE_CLASSES[stock_class]


def __getattr__(name: str):
    """`Stable<Name>ForSequenceClassification` for every decoder classifier `decoder_classifier` gives, built on
    first use (remote-code loading, pickling and `from stable_models import ...` all come through here)."""
    if name.startswith(STABLE_PREFIX) and name.endswith("ForSequenceClassification"):
        model_type = model_type_of(name[len(STABLE_PREFIX) :])
        if model_type is not None:
            try:
                return stable_class(decoder_classifier(model_type))
            except ValueError:
                pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
