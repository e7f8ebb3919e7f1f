"""The Stable embedding models: a decoder's text vector (`pooler_output`) read from the attention mask, never the pad
id: the last real token or the masked mean, in fp32, normalised (cosine similarity = dot product). Padding side,
batch composition and pad == eos do not change a vector.

`Stable<Name>ForEmbedding` is the model type's Stable classifier without its `score` head: the same mask guard, checks,
packed and padded rows and pooling (`modeling_stable.pooled_states`), so every decoder the classifiers cover has one.
Its checkpoint holds the causal LM's backbone under the causal LM's names and says so in `architectures` (vLLM runs a
causal LM as an embedding model), `auto_map` leads `AutoModel` with trust_remote_code to this class, and the
sentence-transformers files (`modules.json`: Transformer, Pooling, Normalize; the prompts) let sentence-transformers
and vLLM pool as it does without remote code.

Part of the core copied next to a checkpoint: imports only torch, transformers and flat `modeling_*` siblings.
"""

import json
import os

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from .modeling_files import INSTALLED_LOAD, MODEL_CARD, card_kind
from .modeling_rules import decoder_classifier, model_type_of
from .modeling_stable import STABLE_PREFIX, pooled_states, stable_class

EMBEDDING_SUFFIX = "ForEmbedding"
ST_POOLING = {"last": "lasttoken", "mean": "mean"}  # sentence-transformers' name of each pooling
ST_FLAGS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


class StableEmbeddingMixin:
    """Put before a Stable classifier class: its backbone, pooling and contract, no head. `pooling` ("last", "mean")
    and `normalize` (default True) are constructor / `from_pretrained` arguments saved in `config.json`
    (`classifier_pooling`, `embedding_normalize`), as are `embedding_dimensions` (Matryoshka: the leading dimensions a
    consumer may keep), the prompts (`embedding_prompts`: {"query": ..., "document": ...}) and `include_prompt`
    (`embedding_include_prompt`, default True; False: the forward's `prompt_length` first tokens of each text stay
    out of the mean, as sentence-transformers' Pooling(include_prompt=False) leaves them)."""

    _keep_in_fp32_modules_strict = []

    def __init__(
        self, config, *args, normalize=None, embedding_dimensions=None, prompts=None, include_prompt=None, **kwargs
    ):
        config.num_labels = 1  # the classifier's head is built, then dropped: an embedder scores nothing
        super().__init__(config, *args, **kwargs)
        del self.score
        if normalize is not None or not hasattr(config, "embedding_normalize"):
            config.embedding_normalize = True if normalize is None else bool(normalize)
        if embedding_dimensions is not None:
            config.embedding_dimensions = sorted({int(d) for d in embedding_dimensions}, reverse=True)
        if prompts is not None:
            config.embedding_prompts = dict(prompts)
        if include_prompt is not None:
            config.embedding_include_prompt = bool(include_prompt)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        use_cache=None,
        prompt_length=None,
        **kwargs,
    ):
        """`pooler_output`: one fp32 vector per text (normalised unless `embedding_normalize` is False);
        `last_hidden_state`: the backbone's. `prompt_length` (an int, or one per text): the tokens of each text's
        prompt, counted as sentence-transformers counts them (`stable_models.prompt_length`); left out of the pooling
        where `embedding_include_prompt` is False, ignored otherwise."""
        return_dict = kwargs.pop("return_dict", None) is not False  # peft passes None: the default, an output object
        leading = None if getattr(self.config, "embedding_include_prompt", True) else prompt_length
        pooled, outputs = pooled_states(
            self, input_ids, attention_mask, position_ids, inputs_embeds, None, use_cache, kwargs, leading
        )
        if self.config.embedding_normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        out = BaseModelOutputWithPooling(
            last_hidden_state=outputs.last_hidden_state,
            pooler_output=pooled,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return out if return_dict else out.to_tuple()

    def save_pretrained(self, save_directory, *args, **kwargs):
        """The Stable save (auto_map to this class, the code files, the pad id), then the causal LM's name in
        `architectures` and the sentence-transformers files every consumer pools by; the model card says `AutoModel`
        (written first: the classifier's save keeps a card that is there)."""
        card = os.path.join(save_directory, "README.md")
        if kwargs.get("is_main_process", True) and not os.path.exists(card):
            os.makedirs(save_directory, exist_ok=True)
            with open(card, "w") as handle:
                handle.write(
                    MODEL_CARD.format(
                        name=type(self).__name__,
                        stock=base_model_name(self.config.model_type),
                        pooling=self.config.classifier_pooling,
                        kind=card_kind(self.config)[0],
                        tag=card_kind(self.config)[1],
                        installed_load=INSTALLED_LOAD,
                        auto_class="AutoModel",
                    )
                )
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return
        path = os.path.join(save_directory, "config.json")
        with open(path) as handle:
            config = json.load(handle)
        config["architectures"] = [causal_lm_name(self.config.model_type)]
        if getattr(self.config, "embedding_dimensions", None):  # vLLM's names: `dimensions=` needs them
            config["is_matryoshka"], config["matryoshka_dimensions"] = True, list(self.config.embedding_dimensions)
        with open(path, "w") as handle:
            handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_sentence_transformers_files(str(save_directory), self.config)


def causal_lm_name(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]


def base_model_name(model_type: str) -> str:
    """The class `AutoModel` loads without remote code (the backbone: no pooling)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return MODEL_MAPPING_NAMES.get(model_type, causal_lm_name(model_type))


def write_sentence_transformers_files(folder: str, config) -> None:
    """modules.json (Transformer, Pooling, and Normalize where the vectors are normalised, in the
    `sentence_transformers.models.*` spelling sentence-transformers 5 and 6 and vLLM 0.32 read), the Pooling config (the
    `pooling_mode` string and the older booleans vLLM also reads), and the prompts and similarity."""
    hidden = config.get_text_config().hidden_size
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if config.embedding_normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        os.makedirs(os.path.join(folder, "2_Normalize"), exist_ok=True)
    mode = ST_POOLING[config.classifier_pooling]
    pooling = {
        "word_embedding_dimension": hidden,
        "pooling_mode": mode,
        **{f"pooling_mode_{flag}": flag == ("mean_tokens" if mode == "mean" else mode) for flag in ST_FLAGS},
        "include_prompt": getattr(config, "embedding_include_prompt", True),
    }
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)  # vLLM reads it as the limit
    length = {"max_seq_length": positions} if positions else {}
    files = {
        "modules.json": modules,
        os.path.join("1_Pooling", "config.json"): pooling,
        "sentence_bert_config.json": {"do_lower_case": False, **length},
        "config_sentence_transformers.json": {
            "model_type": "SentenceTransformer",
            "prompts": dict(getattr(config, "embedding_prompts", None) or {"query": "", "document": ""}),
            "default_prompt_name": None,
            "similarity_fn_name": "cosine" if config.embedding_normalize else "dot",
        },
    }
    for name, value in files.items():
        with open(os.path.join(folder, name), "w") as handle:
            json.dump(value, handle, indent=2)


_EMBEDDING_CLASSES = {}  # Stable classifier class -> its embedder, built once


def embedding_class(stable_classifier):
    """The embedder of a Stable classifier class: the mixin put before it. Lives in this module, so save_pretrained
    copies this file (and its siblings) and writes `auto_map = {"AutoModel": "modeling_embedding.Stable<Name>..."}`."""
    if stable_classifier not in _EMBEDDING_CLASSES:
        name = stable_classifier.__name__.removesuffix("ForSequenceClassification") + EMBEDDING_SUFFIX
        cls = type(
            name,
            (StableEmbeddingMixin, stable_classifier),
            {
                "__module__": __name__,
                "__doc__": f"The embedder of `{stable_classifier.__name__}` (StableEmbeddingMixin).",
            },
        )
        cls.__qualname__ = name
        cls._auto_class = None
        cls.register_for_auto_class("AutoModel")
        _EMBEDDING_CLASSES[stable_classifier] = cls
    return _EMBEDDING_CLASSES[stable_classifier]


def __getattr__(name: str):
    """`Stable<Name>ForEmbedding` for every model type with a Stable classifier, built on first use (remote-code
    loading comes through here)."""
    if name.startswith(STABLE_PREFIX) and name.endswith(EMBEDDING_SUFFIX):
        classifier = name[len(STABLE_PREFIX) : -len(EMBEDDING_SUFFIX)] + "ForSequenceClassification"
        model_type = model_type_of(classifier)
        if model_type is not None:
            try:
                return embedding_class(stable_class(decoder_classifier(model_type)))
            except ValueError:
                pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
