"""Scoring token ids with a Stable model in eval mode: batches of similar length (less padding, the same logits, since
a Stable model's outputs do not depend on padding), returned in the caller's order. `scores` picks what is scored out
of the forward's output (a classifier's logits by default; a model kind's `scores`).
"""

import torch


def classifier_logits(output):
    return output.logits


class Prompted(list):
    """Token ids whose first `prompt_length` tokens are a prompt that an embedder with include_prompt=False leaves
    out of its mean (the scorers pass them to the forward as `prompt_length`)."""

    def __init__(self, ids, prompt_length: int):
        super().__init__(ids)
        self.prompt_length = prompt_length


@torch.no_grad()
def logits_in_length_order(model, tokenizer, ids, batch_size=16, progress=None, scores=classifier_logits):
    """Logits of token-id lists in their order, computed on batches of similar length (less padding, same logits)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    logits = [None] * len(ids)
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in chosen]}, return_tensors="pt")
        if any(isinstance(ids[i], Prompted) for i in chosen):
            batch["prompt_length"] = torch.tensor([getattr(ids[i], "prompt_length", 0) for i in chosen])
        out = scores(model(**{k: v.to(device) for k, v in batch.items()})).float().cpu()
        for row, i in enumerate(chosen):
            logits[i] = out[row]
        if progress is not None:
            progress.update(len(chosen))
    return torch.stack(logits)


SHARED_PREFIX_MIN_TOKENS = 8  # consecutive lists that start alike for fewer tokens are scored apart


@torch.no_grad()
def logits_with_shared_prefixes(
    model, ids, batch_size=16, pad_token_id=0, progress=None, unit_tokens=1024, scores=classifier_logits
):
    """Logits of token-id lists in their order, from packed rows without padding in which consecutive lists that start
    alike (a reranker's documents of one query: the template's head and the query) compute that start once. For models
    that take such rows (`stable_models.modeling_rules.shared_prefix_obstacle` is None); every list gets the logits
    it has alone."""
    from .packing import PackedCollator, shared_prefix_units

    lists = [torch.as_tensor(t, dtype=torch.long) for t in ids]
    units, run = [], [0] if lists else []
    for j in range(1, len(lists)):
        if common_start(lists[run[0]], lists[j]) < SHARED_PREFIX_MIN_TOKENS:
            units += shared_prefix_units([lists[i] for i in run], run[0], unit_tokens)
            run = []
        run.append(j)
    if run:
        units += shared_prefix_units([lists[i] for i in run], run[0], unit_tokens)
    collator = PackedCollator(pad_token_id=pad_token_id)
    device = next(model.parameters()).device
    logits, batch, count = [], [], 0
    for unit in units + [None]:
        if unit is not None:
            batch.append((unit[0], unit[1], list(range(count, count + len(unit[2])))))
            count += len(unit[2])
        if batch and (unit is None or count >= batch_size):
            inputs = collator.rows_of(batch, [{}] * count)
            logits.append(scores(model(**{k: v.to(device) for k, v in inputs.items()})).float().cpu())
            if progress is not None:
                progress.update(count)
            batch, count = [], 0
    return torch.cat(logits) if logits else torch.empty(0)


def common_start(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many first tokens two lists share."""
    length = min(len(a), len(b))
    differs = (a[:length] != b[:length]).nonzero()
    return int(differs[0]) if len(differs) else length


def forward_in_length_order(model, tokenizer, texts, pairs, batch_size=16, progress=True):
    """Logits of every text in input order, computed on batches of similar length (less padding, same logits)."""
    from tqdm.auto import tqdm

    encoded = tokenizer(texts, pairs, truncation=True) if pairs is not None else tokenizer(texts, truncation=True)
    with tqdm(total=len(texts), desc="scoring", disable=not progress, unit="row") as bar:
        return logits_in_length_order(model, tokenizer, encoded["input_ids"], batch_size, bar)
