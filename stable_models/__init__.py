"""stable_models: numerically stable, padding-correct decoder-LLM sequence classifiers (classifiers, reward models,
rerankers) and embedding models for transformers.

`stable_models.Stable<Name>ForSequenceClassification` exists for every decoder-only text model type of the installed
transformers that the rules in `modeling_rules` accept: its stock `<Name>ForSequenceClassification` (Qwen2, Gemma2,
GPT-2, ...) or, for a causal LM without one, the classifier transformers would write for it (Gemma 4, Llama 4,
Granite, ...). `supported_model_types()` lists them; `registry.refused_model_types()` says why the others get none.
Around them: packing collators, losses and Trainers that stay exact under gradient accumulation, calibration
(`calibrate`), and the `stable-models` command line (the `stable_models.cli` package, which this library never
imports).

Every public name is resolved on first use, so `import stable_models` imports neither torch nor transformers (the
command line's `--help` stays instant). Importing it changes nothing global: no transformers class or registry is
patched, and no architecture's modeling code is imported.
"""

import importlib
import importlib.util

__version__ = "0.6.0"

# public name -> the module that defines it
PUBLIC = {
    "POOLING_MODES": "modeling_pooling",
    "StableSequenceClassificationMixin": "modeling_stable",
    "Fp32Linear": "modeling_loss",
    "STABLE_CLASSES": "registry",
    "from_pretrained": "loading",
    "register": "registry",
    "registered": "registry",
    "stable_class_for": "registry",
    "embedding_class_for": "registry",
    "supported_model_types": "registry",
    "unregister": "registry",
    "PackedCollator": "packing",
    "PackedPairCollator": "packing",
    "PackedGroupCollator": "packing",
    "bradley_terry_loss": "losses.bradley_terry",
    "ranking_loss": "losses",
    "BradleyTerryLoss": "losses.bradley_terry",
    "ListwiseLoss": "losses.listwise",
    "PointwiseLoss": "losses.pointwise",
    "RankNetLoss": "losses.ranknet",
    "DistillationLoss": "losses.distillation",
    "StableTrainer": "trainers",
    "PairwiseTrainer": "trainers",
    "RankingTrainer": "trainers",
    "EmbeddingTrainer": "embedding_training",
    "EmbeddingCollator": "embedding_training",
    "InfoNCELoss": "losses.info_nce",
    "NonFiniteError": "guards",
    "NonFiniteGuard": "guards",
    "StopOnNonFinite": "guards",
    "calibrate": "calibration",
    "ClassificationEvaluator": "evaluators",
    "PairwiseEvaluator": "evaluators",
    "RankingEvaluator": "evaluators",
    "get_reward": "trl_compat",
    "setup_pad_token": "tokenization",
    "append_eos": "tokenization",
    "prompt_length": "tokenization",
    "check_checkpoint": "verify",
    "verify_folder": "verify",
}


def __getattr__(name: str):
    """The public names, and `stable_models.StableQwen3MoeForSequenceClassification` and the like (built by
    modeling_stable on first use), imported when first asked for."""
    if name in PUBLIC:
        value = getattr(importlib.import_module(f".{PUBLIC[name]}", __name__), name)
        globals()[name] = value  # looked up once
        return value
    if name.startswith("Stable") and name.endswith("ForEmbedding"):
        return getattr(importlib.import_module(".modeling_embedding", __name__), name)
    if name.startswith("Stable"):
        return getattr(importlib.import_module(".modeling_stable", __name__), name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # `stable_models.registry` without importing it
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(PUBLIC))


__all__ = sorted(PUBLIC)
