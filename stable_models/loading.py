"""One loader for every folder `train` writes (classifiers, reward models, rerankers and embedders), and for the
checkpoints it starts from: `stable_models.from_pretrained`, `predict`, `evaluate`, `verify` and the consumer matrix
all come through here.

The folder's form (`modeling_files.folder_form`) picks the way in:
- merged (config.json): the Stable class of its model_type and kind (`model_kind`: an embedder's config names its
  normalisation), from the installed package (no code from the folder runs); also a base causal LM or a GGUF file
  (`gguf_file=`), which becomes a new classifier;
- adapter (adapter_config.json, `train --save-adapter`): the base the adapter names, built with the folder's
  `stable_config.json` (labels, pooling, template: what peft does not keep), the adapter applied and merged, as
  `predict` scores it (`merge=False`: the peft model);
- generative (`train --save-generative`): a plain causal LM without a score head, refused with the loader that loads it.
"""

import json
from pathlib import Path

from .adapters import STABLE_CONFIG
from .modeling_files import ADAPTER, ADAPTER_CONFIG, EMBEDDER, GENERATIVE, folder_form, model_kind
from .registry import embedding_class_for, stable_class_for

GENERATIVE_LOADER = (
    "transformers.AutoModelForCausalLM.from_pretrained(folder) (its score is logit(yes) - logit(no) at the last "
    "position, reranker.json says which tokens), or stable_models.from_pretrained on the trained folder above it"
)


def refuse_generative(folder) -> None:
    if folder_form(folder) == GENERATIVE:
        raise ValueError(
            f"{folder}: a reranker's generative form, a causal LM with no score head: load it with {GENERATIVE_LOADER}"
        )


def adapter_base(folder) -> str | None:
    """The base checkpoint adapter_config.json names."""
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")


def folder_config(folder):
    """The model's config for any folder `train` writes (an adapter's is its stable_config.json), without weights."""
    from transformers import AutoConfig

    refuse_generative(folder)
    if folder_form(folder) != ADAPTER:
        return AutoConfig.from_pretrained(folder)
    saved = Path(folder) / STABLE_CONFIG
    if not saved.is_file():
        base = adapter_base(folder)
        if not base:
            raise ValueError(f"{folder}: adapter_config.json names no base_model_name_or_path; {adapter_fix(folder)}")
        return AutoConfig.from_pretrained(base, trust_remote_code=False)
    values = json.loads(saved.read_text())
    return type(AutoConfig.for_model(values["model_type"])).from_dict(values)


def from_pretrained(pretrained_model_name_or_path, *, merge: bool = True, **kwargs):
    """Load any folder `train` writes, or any supported checkpoint, as its Stable class (picked by model_type): a
    merged classifier, a base causal LM (also from a GGUF file, `gguf_file=`), or an adapter folder, which loads its
    base with the folder's stable_config.json, applies the adapter and merges it (`merge=False`: the peft model)."""
    from transformers import AutoConfig

    path = pretrained_model_name_or_path
    if Path(path).is_dir():
        refuse_generative(path)
        if folder_form(path) == ADAPTER:
            return from_adapter_folder(path, merge=merge, **kwargs)
    config = kwargs.get("config")  # a config the caller read already is not read again
    if config is None:
        where = {key: kwargs[key] for key in ("gguf_file", "subfolder", "revision") if kwargs.get(key)}
        config = AutoConfig.from_pretrained(path, trust_remote_code=False, **where)
    if model_kind(config) == EMBEDDER:
        return embedding_class_for(config.model_type).from_pretrained(path, **kwargs)
    return stable_class_for(config.model_type).from_pretrained(path, **kwargs)


def adapter_fix(folder) -> str:
    return (
        f"load the base yourself and add the adapter: model = stable_models.from_pretrained(base_folder, "
        f"num_labels=...); model = peft.PeftModel.from_pretrained(model, {str(folder)!r})"
    )


def from_adapter_folder(folder, merge: bool = True, **kwargs):
    """The Stable model an adapter folder describes: its base (with the saved config: stable_config.json, or for a
    plain peft adapter the base's, with num_labels from the saved head), the adapter applied, merged unless asked."""
    from peft import PeftModel
    from transformers import AutoConfig

    base = adapter_base(folder)
    if not base:
        raise ValueError(f"{folder}: adapter_config.json names no base_model_name_or_path; {adapter_fix(folder)}.")
    try:
        config = folder_config(folder)
        gguf_file = getattr(config, "stable_models_gguf_file", None)
        options = {"gguf_file": gguf_file} if gguf_file else {}
        base_vocab = AutoConfig.from_pretrained(base, trust_remote_code=False, **options).vocab_size
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{folder}: the adapter's base model {base!r} (adapter_config.json, base_model_name_or_path) cannot be "
            f"loaded here ({str(error).splitlines()[0]}). Put the base checkpoint at that path or set the field to a "
            f"local copy, or {adapter_fix(folder)}."
        ) from None
    if (Path(folder) / STABLE_CONFIG).is_file():
        kwargs["config"] = config
        trained_vocab = config.vocab_size  # setup_pad_token may have added a row, which peft saved with the adapter
        config.vocab_size = base_vocab
    else:
        trained_vocab = base_vocab
        if "num_labels" not in kwargs and (labels := saved_head_rows(folder)):
            kwargs["num_labels"] = labels
    build = embedding_class_for if model_kind(config) == EMBEDDER else stable_class_for
    model = build(config.model_type).from_pretrained(base, **options, **kwargs)
    if trained_vocab > base_vocab:
        model.resize_token_embeddings(trained_vocab)
    adapted = PeftModel.from_pretrained(model, str(folder))
    return adapted.merge_and_unload() if merge else adapted


def saved_head_rows(folder) -> int | None:
    """Rows of the `score` weight a SEQ_CLS adapter saved (peft keeps the trained head in modules_to_save)."""
    from safetensors import safe_open

    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as weights:
        for key in weights.keys():
            if key.endswith("score.weight"):
                return weights.get_slice(key).get_shape()[0]
    return None
