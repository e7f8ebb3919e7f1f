"""The model card of a folder `train` writes: what a model hub shows (front matter: `base_model`, `pipeline_tag`, the
labels, the training data as file name, rows and sha256, the evaluation metrics as `model-index`) above a body that
says how to load the folder. A merged folder keeps the body the core's `save_pretrained` wrote; an adapter folder's
body (peft writes its empty template card there) is built here from the folder's row of the consumer matrix.
huggingface_hub (a transformers dependency) writes the front matter as hubs read it."""

import hashlib
from pathlib import Path

from .modeling_files import card_kind


def data_record(path, rows: int) -> dict:
    """The training file as the card names it: its file name, rows and sha256 (the bytes trained on)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"file": Path(path).name, "rows": rows, "sha256": digest.hexdigest()}


def front_matter(config, name: str, base_model: str, data: dict, metrics: dict, adapter: bool) -> str:
    """The card's YAML front matter: base model, pipeline tag, labels, training data and model-index results (on
    `data["evaluated_on"]`)."""
    from huggingface_hub import EvalResult, ModelCardData

    tag = card_kind(config)[1]
    results = [
        EvalResult(
            task_type=tag,
            dataset_type="json",
            dataset_name=data.get("evaluated_on", data["file"]),
            metric_type=name,
            metric_value=float(value),
        )
        for name, value in metrics.items()
    ]
    card = ModelCardData(
        base_model=base_model,
        library_name="peft" if adapter else "transformers",
        pipeline_tag=tag,
        tags=["stable_models", tag],
        model_name=name,
        eval_results=results or None,
        labels=[config.id2label[i] for i in sorted(config.id2label)],
        training_data=data,
    )
    return f"---\n{card.to_yaml()}\n---\n"


def body_of(card_text: str) -> str:
    """A card's text below its front matter."""
    if card_text.startswith("---\n"):
        end = card_text.find("\n---\n", 4)
        if end != -1:
            return card_text[end + len("\n---\n") :]
    return card_text


def adapter_body(config, base_model: str, cells) -> str:
    """An adapter folder's body: what it is, the one loader that merges it as predict scores it, the consumer row."""
    kind = card_kind(config)[0]
    lines = "\n".join(f"- {cell.line()}" for cell in cells)
    return (
        f"# A stable_models {kind.split(':')[0]}, as a peft adapter\n\n"
        f"A LoRA adapter (and its trained `score` head) on `{base_model}`, with the model's config in "
        "`stable_config.json` (labels, pooling, template), which peft does not keep.\n\n"
        "## Loading it\n\n```python\nimport stable_models\n"
        'model = stable_models.from_pretrained("path/to/this/folder")  # merged; merge=False gives the peft model\n'
        "```\n\n## Who scores it as trained\n\n" + lines + "\n"
    )


def write_card(folder, config, base_model: str, data: dict, metrics: dict, cells=None) -> None:
    """README.md: the front matter, then the body the core wrote (merged) or the adapter's own (`cells`: the folder's
    row of the consumer matrix; peft's template card is replaced)."""
    path = Path(folder) / "README.md"
    adapter = cells is not None
    body = adapter_body(config, base_model, cells) if adapter else body_of(path.read_text())
    path.write_text(front_matter(config, Path(folder).name, base_model, data, metrics, adapter) + body)
