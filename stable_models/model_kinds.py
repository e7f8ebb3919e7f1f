"""What kind of model a task trains and scores. A task of the command line names its kind (`Task.model_kind`); the
shared commands ask the kind, never the task's name: how its model loads, which peft task type keeps its head
trainable, what its forward's scores are, which vLLM call gives the same, what the pre-flight checks before step 1,
which folders are trained ones, and which consumers read a folder. Kinds live in the library: the command line imports
them, never the other way round (and `--help`, which imports the tasks, imports no torch through them).

`SEQUENCE_CLASSIFIER`: one head (`score`) over the pooled hidden state, its logits the scores (classifiers, reward
models and rerankers alike). `EMBEDDER_KIND`: no head, the pooled fp32 vector the scores (embedding models).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Preflight:
    """The pre-flight's verdict: {check: what breaks the contract} (empty when healthy), the largest score difference
    between the two padding sides, and the trainable parameters that got no gradient (DDP must look for them)."""

    problems: dict
    padding_error: float
    unused: list


class ModelKind:
    name = ""
    lora_task_type = ""  # peft's LoraConfig(task_type=...): which modules it keeps trainable beside the LoRA
    auto_class = ""  # the transformers Auto class a trained folder's auto_map names
    scores_noun = "scores"  # what its scores are called in messages

    def load(self, path, **kwargs):
        """The model of this kind on a checkpoint (a base causal LM or a trained folder of any form)."""
        raise NotImplementedError

    def check_trained(self, config) -> None:
        """A ValueError when a folder's config is not a trained model of this kind (a base causal LM, say)."""
        raise NotImplementedError

    def scores(self, output):
        """The scores `predict` writes from, out of the model's forward output: [rows, outputs]."""
        raise NotImplementedError

    def vllm_scores(self, llm, ids):
        """The same scores from vLLM's pooling runner on token-id lists, in their order."""
        raise NotImplementedError

    def preflight(self, model, tokenizer, examples) -> Preflight:
        """The numerics before step 1 on the model as it will train, at about one step's cost; leaves the weights and
        gradients as they were."""
        raise NotImplementedError

    def consumers(self, folder) -> list:
        """The folder's row of the consumer matrix (`consumers.Cell`s)."""
        raise NotImplementedError


PADDING_SIDES = ("right", "left")
PREFLIGHT_EXAMPLES = 4


class SequenceClassifierKind(ModelKind):
    name = "sequence classifier"
    lora_task_type = "SEQ_CLS"  # keeps `score` in modules_to_save, trained in fp32
    auto_class = "AutoModelForSequenceClassification"
    scores_noun = "logits"

    def load(self, path, **kwargs):
        from .loading import from_pretrained

        return from_pretrained(path, **kwargs)

    def check_trained(self, config) -> None:
        names = config.architectures or []
        if self.auto_class not in (getattr(config, "auto_map", None) or {}) and not any(
            name.endswith("ForSequenceClassification") for name in names
        ):
            raise ValueError(f"not a classifier ({', '.join(names) or 'no architectures'}); train one first")

    def scores(self, output):
        return output.logits

    def vllm_scores(self, llm, ids):
        import torch
        from vllm import PoolingParams

        outputs = llm.classify(
            [{"prompt_token_ids": i} for i in ids], pooling_params=PoolingParams(use_activation=False), use_tqdm=False
        )
        return torch.tensor([output.outputs.probs for output in outputs], dtype=torch.float32)

    def preflight(self, model, tokenizer, examples) -> Preflight:
        """The doctor's numerics check (`numerics.check_numerics`): one forward and backward of a right-padded batch
        of the shortest examples with their labels, one forward of the same batch left-padded."""
        import torch

        from .numerics import check_numerics

        ids, labels, label_dtype = preflight_batch(*examples)
        labels = torch.tensor(labels, dtype=label_dtype)
        right, left = (
            dict(tokenizer.pad({"input_ids": ids}, padding_side=side, return_tensors="pt")) for side in PADDING_SIDES
        )
        found = check_numerics(model, right, labels, [(left, labels)])
        return Preflight(found.problems(torch.float32), found.padding_error, found.unused)

    def consumers(self, folder) -> list:
        from .consumers import folder_table

        return folder_table(folder)


def preflight_batch(ids, labels, label_dtype):
    """The PREFLIGHT_EXAMPLES shortest of the task's candidate examples (a few of the first in the data), of
    different lengths where they have them, so that padding has work to do while the batch costs less than a step."""
    by_length = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    distinct = list({len(ids[i]): i for i in reversed(by_length)}.values())[::-1]  # the first of each length
    chosen = (distinct + [i for i in by_length if i not in distinct])[:PREFLIGHT_EXAMPLES]
    return [ids[i] for i in chosen], [labels[i] for i in chosen], label_dtype


class EmbedderKind(ModelKind):
    """An embedding model (`modeling_embedding`): no head, its scores the fp32 vector (`pooler_output`)."""

    name = "embedder"
    lora_task_type = "FEATURE_EXTRACTION"  # nothing beside the LoRA trains
    auto_class = "AutoModel"
    scores_noun = "vectors"

    def load(self, path, **kwargs):
        """A trained embedder as saved, or a new one on a base checkpoint (a causal LM, a GGUF file)."""
        from transformers import AutoConfig

        from .loading import folder_config, from_pretrained
        from .modeling_files import EMBEDDER, model_kind
        from .registry import embedding_class_for

        config = kwargs.get("config")
        if config is None:
            where = {"gguf_file": kwargs["gguf_file"]} if kwargs.get("gguf_file") else {}
            config = folder_config(path) if not where else AutoConfig.from_pretrained(path, **where)
        if model_kind(config) == EMBEDDER:
            return from_pretrained(path, **kwargs)
        return embedding_class_for(config.model_type).from_pretrained(path, **kwargs)

    def check_trained(self, config) -> None:
        from .modeling_files import EMBEDDER, model_kind

        if model_kind(config) != EMBEDDER:
            raise ValueError("not an embedding model (its config names no embedding_normalize); train one first")

    def scores(self, output):
        return output.pooler_output

    def vllm_scores(self, llm, ids):
        import torch

        outputs = llm.embed([{"prompt_token_ids": i} for i in ids], use_tqdm=False)
        return torch.tensor([output.outputs.embedding for output in outputs], dtype=torch.float32)

    def preflight(self, model, tokenizer, examples) -> Preflight:
        """One forward and backward of the shortest examples right-padded (a loss on the vectors), one forward of the
        same batch left-padded: finite vectors and gradients, the same vectors on both sides."""
        import torch

        ids = preflight_batch(examples[0], [0] * len(examples[0]), None)[0]
        right, left = (
            dict(tokenizer.pad({"input_ids": ids}, padding_side=side, return_tensors="pt")) for side in PADDING_SIDES
        )
        was_training = model.training
        model.eval()
        try:
            vectors = model(**right).pooler_output
            (vectors @ vectors.detach().T).sum().backward()
            trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
            finite = bool(torch.isfinite(vectors).all()) and all(
                torch.isfinite(p.grad).all() for p in trained.values() if p.grad is not None
            )
            unused = [name for name, p in trained.items() if p.grad is None]
            with torch.no_grad():
                error = (model(**left).pooler_output - vectors.detach()).abs().max().item()
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)
        problems = {} if finite else {"finite": "non-finite vectors or gradients"}
        if finite and error > 1e-3:
            problems["padding"] = f"left and right padding give vectors {error:.2e} apart"
        return Preflight(problems, error, unused)

    def consumers(self, folder) -> list:
        from .consumers import folder_table

        return folder_table(folder)


SEQUENCE_CLASSIFIER = SequenceClassifierKind()
EMBEDDER_KIND = EmbedderKind()
