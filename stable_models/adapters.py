"""A trained LoRA kept as a peft adapter instead of merged: `adapter_config.json` naming the base and
`adapter_model.safetensors` with the LoRA weights and the `score` head (peft's `modules_to_save`), as multi-adapter
servers (vLLM) and peft load them; plus `stable_config.json`, the classifier's config (labels, pooling, a reranker's
template), which peft does not keep and which the base checkpoint (a causal LM) does not have.

Loading it is `loading.from_pretrained`'s (the one loader of every folder `train` writes).
"""

import json
from pathlib import Path

STABLE_CONFIG = "stable_config.json"


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
