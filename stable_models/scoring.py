"""Scoring token ids with a classifier in eval mode: batches of similar length (less padding, the same logits, since a
Stable model's logits do not depend on padding), returned in the caller's order.
"""

import torch


@torch.no_grad()
def logits_in_length_order(model, tokenizer, ids, batch_size=16, progress=None):
    """Logits of token-id lists in their order, computed on batches of similar length (less padding, same logits)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    logits = [None] * len(ids)
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in chosen]}, return_tensors="pt")
        out = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
        for row, i in enumerate(chosen):
            logits[i] = out[row]
        if progress is not None:
            progress.update(len(chosen))
    return torch.stack(logits)


def forward_in_length_order(model, tokenizer, texts, pairs, batch_size=16, progress=True):
    """Logits of every text in input order, computed on batches of similar length (less padding, same logits)."""
    from tqdm.auto import tqdm

    encoded = tokenizer(texts, pairs, truncation=True) if pairs is not None else tokenizer(texts, truncation=True)
    with tqdm(total=len(texts), desc="scoring", disable=not progress, unit="row") as bar:
        return logits_in_length_order(model, tokenizer, encoded["input_ids"], batch_size, bar)
