"""The files of a saved checkpoint: the checks that make a broken folder fail with a clear message (config.json,
code files, safetensors headers), the stock architecture name engines pick by, the sentence-transformers pooling
files vLLM reads, the pad id serving needs, and the model card.

Part of the core copied next to a checkpoint (a class loaded as remote code saves again).
"""

import hashlib
import json
import os
import re
import struct

from .modeling_pooling import DEFAULT_POOLING, POOLING_MODES

MODEL_CARD = """---
library_name: transformers
tags: [stable_models, {tag}]
---
# {name}

A `stable_models` {kind} (`{name}`, pooling `{pooling}`): pooling from `attention_mask`, padding-invariant
logits, no fully masked attention rows, fp32 head, logits and loss.

## Loading it

With `stable_models` installed, no code from this folder runs: the class comes from the installed package.

```python
{installed_load}
```

Without it, transformers runs this folder's code files (`modeling_*.py`) as remote code. Check first that they are
byte-identical to a `stable_models` release's (`stable-models verify` exits 0 and names the release), and pin
`revision=` to a commit when loading from a hub:

```python
# stable-models verify path/to/this/folder
from transformers import {auto_class}
model = {auto_class}.from_pretrained("path/to/this/folder", trust_remote_code=True)
```

**Without either, transformers silently loads the stock `{stock}`** (same weights, none of the guarantees; it
pools by pad id, which differs where pad == eos). Check with `type(model).__name__ == "{name}"`.
"""


# the card's snippet, one line here: this core file imports only torch, transformers and its siblings
INSTALLED_LOAD = 'import stable_models\nmodel = stable_models.from_pretrained("path/to/this/folder")'

REWARD_KIND = (
    "reward model: one output, `reward` (higher is preferred), trained on preference pairs with the Bradley-Terry "
    "loss, read at the last token of the response (its eos or end-of-turn token)"
)


RERANKER_KIND = (
    "reranker: one output, `score` (higher is more relevant), for a (query, document) rendered with the template in "
    "config.json (`reranker_template`, `reranker_instruction`), read at the last token"
)


# a folder's form: the files `train` writes decide it (`folder_form`)
MERGED, ADAPTER, GENERATIVE = "merged", "adapter", "generative"
ADAPTER_CONFIG = "adapter_config.json"  # peft's: an adapter on a base checkpoint (train --save-adapter)
GENERATIVE_MARK = "reranker.json"  # a reranker's generative form: a causal LM, no score head (train --save-generative)

# a model's kind: what its config says it scores (`model_kind`)
CLASSIFIER, REWARD_MODEL, RERANKER, EMBEDDER = "classifier", "reward model", "reranker", "embedder"


def folder_form(folder) -> str:
    """The one answer to "what form is this folder": an adapter (peft's adapter_config.json on a base checkpoint), a
    generative reranker (a causal LM whose logit(yes) - logit(no) is the score), or a whole model (merged)."""
    if os.path.isfile(os.path.join(folder, ADAPTER_CONFIG)):
        return ADAPTER
    if os.path.isfile(os.path.join(folder, GENERATIVE_MARK)):
        return GENERATIVE
    return MERGED


def model_kind(config) -> str:
    """The one answer to "what does this model score", from its config (a transformers config or config.json's dict):
    a reranker keeps the template its inputs were rendered with, a reward model has one output labelled "reward"."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    if get("embedding_normalize") is not None:  # an embedder's config says how its vectors are normalised
        return EMBEDDER
    if get("reranker_template") is not None:
        return RERANKER
    labels = {str(k): v for k, v in (get("id2label") or {}).items()}
    return REWARD_MODEL if labels == {"0": "reward"} else CLASSIFIER


EMBEDDER_KIND = (
    "embedding model: one vector per text, `pooler_output`, read from the attention mask in fp32 (normalised where "
    "config.json's `embedding_normalize` says so); the prompts it was trained with are in `embedding_prompts`"
)


def card_kind(config) -> tuple[str, str]:
    """(what the model card calls the model, its hub pipeline tag)."""
    return {
        REWARD_MODEL: (REWARD_KIND, "reward-model"),
        RERANKER: (RERANKER_KIND, "text-ranking"),
        CLASSIFIER: ("sequence classifier", "text-classification"),
        EMBEDDER: (EMBEDDER_KIND, "feature-extraction"),
    }[model_kind(config)]


CODE_VERSION = "0.6.0"  # stable_models.__version__ (a test keeps them equal): recorded next to the code it wrote


AUTO_CLASSES = ("AutoModelForSequenceClassification", "AutoModel")  # what a Stable folder's auto_map leads to


def auto_map_target(config: dict) -> str | None:
    """config.json's auto_map target of a Stable class ("modeling_x.Class"): a classifier's, or an embedder's."""
    auto_map = config.get("auto_map") or {}
    return next((auto_map[name] for name in AUTO_CLASSES if auto_map.get(name)), None)


def record_code_files(folder: str) -> None:
    """config.json records the stable_models version and the sha256 of each code file save_pretrained wrote, so
    `stable-models verify` can tell a file that changed after saving."""
    path = os.path.join(folder, "config.json")
    with open(path) as handle:
        config = json.load(handle)
    target = auto_map_target(config)
    if not target:
        return
    hashes = {}
    for name in code_files(folder, target.split("--")[-1].rsplit(".", 1)[0] + ".py"):
        with open(os.path.join(folder, name), "rb") as handle:
            hashes[name] = hashlib.sha256(handle.read()).hexdigest()
    config["stable_models_version"], config["stable_models_code_sha256"] = CODE_VERSION, hashes
    with open(path, "w") as handle:
        handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


# Serving engines read a classifier's pooling from sentence-transformers files, not from config.json: vLLM's
# get_pooling_config takes the seq pooling from the Pooling module's config.json (last-token without one) and its
# activation from whether a Normalize module is listed. Written for `pooling="mean"` checkpoints only.
SENTENCE_TRANSFORMERS_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


POOLING_FLAGS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def name_the_stock_architecture(folder: str, stock_name: str) -> None:
    """config.json's `architectures` as the stock class would write it. vLLM and other engines refuse a Stable name
    (they pick their implementation by it); `auto_map` still leads transformers to the Stable class."""
    path = os.path.join(folder, "config.json")
    with open(path) as handle:
        config = json.load(handle)
    if config.get("architectures") != [stock_name]:
        config["architectures"] = [stock_name]
        with open(path, "w") as handle:
            handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_pooling_files(folder: str, pooling: str, hidden_size: int) -> None:
    """A mean-pooled checkpoint carries modules.json + 1_Pooling/config.json (mean) so vLLM pools as we do (its
    default is the last token); a last-pooled one needs none, and files written here earlier are removed."""
    modules = os.path.join(folder, "modules.json")
    if pooling == "mean":
        os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
        os.makedirs(os.path.join(folder, "2_Normalize"), exist_ok=True)
        flags = {f"pooling_mode_{flag}": flag == "mean_tokens" for flag in POOLING_FLAGS}
        with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as handle:
            json.dump({"word_embedding_dimension": hidden_size, **flags, "include_prompt": True}, handle, indent=2)
        with open(modules, "w") as handle:
            json.dump(SENTENCE_TRANSFORMERS_MODULES, handle, indent=2)
        return
    try:
        with open(modules) as handle:
            ours = json.load(handle) == SENTENCE_TRANSFORMERS_MODULES
    except (OSError, ValueError):
        ours = False
    if ours:  # a stale mean-pooling declaration in a folder this checkpoint now overwrites
        os.remove(modules)
        pooling_config = os.path.join(folder, "1_Pooling", "config.json")
        if os.path.isfile(pooling_config):
            os.remove(pooling_config)
        for path in (os.path.join(folder, "1_Pooling"), os.path.join(folder, "2_Normalize")):
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)


def tokenizer_pad_token_id(*sources) -> int | None:
    """The pad id of the first tokenizer found locally at one of these folders or cached hub ids (no download)."""
    from transformers import AutoTokenizer  # only when a checkpoint is saved without pad_token_id

    for source in sources:
        if not source:
            continue
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except Exception:  # no tokenizer there: try the next source
            continue
        if getattr(tokenizer, "pad_token_id", None) is not None:
            return tokenizer.pad_token_id
    return None


NO_PAD_TOKEN_ID = (
    "{name}.save_pretrained({folder!r}): config.json gets no pad_token_id and no tokenizer with a pad token was "
    "found next to the model or where it was loaded from. This model pools by attention_mask and does not need it, "
    "but serving engines (TEI, infinity) and the stock class refuse batches of more than one text without it. Call "
    "stable_models.setup_pad_token(tokenizer, model) (or set model.config.pad_token_id) before saving."
)


def _fail(path, problem, fix):
    raise ValueError(f"{path}: {problem}. {fix}")


def check_safetensors(path: str) -> None:
    """Read a safetensors header with the standard library and check the file holds every tensor it lists."""
    size = os.path.getsize(path)
    fix = "The file is truncated or corrupt: save the model again or copy the file again."
    with open(path, "rb") as handle:
        if size < 8:
            _fail(path, f"only {size} bytes, no safetensors header", fix)
        (header_size,) = struct.unpack("<Q", handle.read(8))
        if header_size > size - 8:
            _fail(path, f"header of {header_size} bytes does not fit in a {size}-byte file", fix)
        try:
            header = json.loads(handle.read(header_size))
        except ValueError:
            _fail(path, "the safetensors header is not valid JSON", fix)
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    if 8 + header_size + end > size:
        _fail(path, f"{size} bytes, but its tensors need {8 + header_size + end}", fix)


RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import", re.MULTILINE)


def code_files(folder: str, first: str) -> list[str]:
    """`first` and every file it imports as `from .x import` (recursively): the files transformers copies and loads
    for remote code (its `get_relative_import_files` rule). Files that are missing are listed, not read."""
    found, queue = [], [first]
    while queue:
        name = queue.pop(0)
        if name in found:
            continue
        found.append(name)
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                queue += [f"{module}.py" for module in RELATIVE_IMPORT.findall(handle.read())]
    return found


def check_saved_folder(folder: str, require_auto_map: bool = True, pooling: str | None = None) -> None:
    """Raise a ValueError naming the file and the fix if a saved folder cannot load as a Stable model.

    Checks config.json, the classifier_pooling value (unless `pooling` overrides it), every weights file and, with
    `require_auto_map`, the auto_map entry and the code files that trust_remote_code loading needs.
    """
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        _fail(folder, "no config.json", "Point from_pretrained at the folder save_pretrained wrote.")
    try:
        with open(config_path) as handle:
            config = json.load(handle)
    except ValueError as error:
        _fail(config_path, f"not valid JSON ({error})", "Restore the file, or save the model again.")
    value = pooling or config.get("classifier_pooling", DEFAULT_POOLING)
    if value not in POOLING_MODES:
        _fail(
            config_path,
            f"classifier_pooling={value!r} is not one of {POOLING_MODES}",
            "Set it to 'last' or 'mean' in config.json, or pass pooling='last' to from_pretrained.",
        )
    if require_auto_map:
        target = auto_map_target(config)
        if not target:
            _fail(
                config_path,
                "no auto_map for AutoModelForSequenceClassification, so AutoModel with "
                "trust_remote_code=True would silently load the stock class",
                "Load it with the Stable class's from_pretrained and save_pretrained it again.",
            )
        code_file = target.split("--")[-1].rsplit(".", 1)[0] + ".py"
        for name in code_files(folder, code_file):
            needed = os.path.join(folder, name)
            if not os.path.isfile(needed):
                _fail(needed, "missing: auto_map needs this code file", "Save the model again with save_pretrained.")
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
    elif os.path.isfile(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    elif os.path.isfile(os.path.join(folder, "pytorch_model.bin")):
        files = []
    else:
        _fail(
            folder,
            "no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)",
            "Copy the weights next to config.json, or save the model again.",
        )
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            _fail(path, "missing: the weights index lists it", "Copy every shard next to the index, or save again.")
        check_safetensors(path)
