"""Padding-free batches for classification: several examples in one row, position ids restarting per example.

`Trainer(..., data_collator=stable_models.PackedCollator())` packs each batch into one row, so no compute is spent on
padding; Stable classes pool each example separately, and every example gets its unpadded logits.
"""

import torch


class PackedCollator:
    """Collate features with `input_ids` (and `labels`/`label`) into one row: `input_ids` and `position_ids` of shape
    (1, total tokens) and `labels` of shape (examples,). No attention_mask: the restarting position ids mark the
    examples, and transformers builds block-diagonal attention from them."""

    def __call__(self, features: list[dict]) -> dict:
        ids = [torch.as_tensor(f["input_ids"], dtype=torch.long).flatten() for f in features]
        if any(len(i) == 0 for i in ids):
            raise ValueError("PackedCollator: an example has no tokens; drop empty texts before training.")
        batch = {
            "input_ids": torch.cat(ids)[None],
            "position_ids": torch.cat([torch.arange(len(i)) for i in ids])[None],
        }
        key = "labels" if "labels" in features[0] else "label" if "label" in features[0] else None
        if key is not None:
            labels = [torch.as_tensor(f[key]) for f in features]
            batch["labels"] = torch.stack(labels)
        return batch
