"""A trained LoRA kept as a peft adapter instead of merged: `adapter_config.json` naming the base and
`adapter_model.safetensors` with the LoRA weights and the `score` head (peft's `modules_to_save`), as multi-adapter
servers (vLLM) and peft load them; plus `stable_config.json`, the classifier's config (labels, pooling, a reranker's
template), which peft does not keep and which the base checkpoint (a causal LM) does not have.

`load_adapter_folder` builds the Stable class on the base with that config, applies the adapter and merges it:
the model `stable-models predict` scores.
"""

import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
STABLE_CONFIG = "stable_config.json"


def is_adapter_folder(folder) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def save_adapter(peft_model, tokenizer, folder, gguf_file: str | None = None) -> None:
    """The unmerged adapter (LoRA and `score`), the tokenizer and the classifier's config, into `folder`."""
    folder = Path(folder)
    peft_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = peft_model.get_base_model().config.to_dict()
    config.pop("quantization_config", None)  # --qlora: the base loads in full precision for scoring
    if gguf_file:
        config["stable_models_gguf_file"] = gguf_file
    (folder / STABLE_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def adapter_config(folder):
    """(the base checkpoint the adapter names, the classifier's config as a transformers config)."""
    from transformers import AutoConfig

    folder = Path(folder)
    base = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not (folder / STABLE_CONFIG).is_file():
        raise ValueError(f"{folder}: a peft adapter without {STABLE_CONFIG}; save it with train --save-adapter")
    values = json.loads((folder / STABLE_CONFIG).read_text())
    config_class = type(AutoConfig.for_model(values["model_type"]))
    return base, config_class.from_dict(values)


def load_adapter_folder(folder, **kwargs):
    """The Stable classifier the adapter folder describes: its base checkpoint, its config, the adapter merged."""
    from peft import PeftModel
    from transformers import AutoConfig

    from .registry import from_pretrained

    base, config = adapter_config(folder)
    gguf_file = getattr(config, "stable_models_gguf_file", None)
    if not base or not Path(base).exists():
        raise ValueError(f"{folder}: the adapter's base {base!r} is not a folder here; edit adapter_config.json")
    options = {"gguf_file": gguf_file} if gguf_file else {}
    trained_vocab = config.vocab_size  # setup_pad_token may have added a row, which peft saved with the adapter
    config.vocab_size = AutoConfig.from_pretrained(base, **options).vocab_size
    model = from_pretrained(base, config=config, **options, **kwargs)
    if trained_vocab > config.vocab_size:
        model.resize_token_embeddings(trained_vocab)
    return PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
