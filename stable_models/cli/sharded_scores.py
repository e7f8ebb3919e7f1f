"""The one scorer of `evaluate` and `predict`, for every task and both engines: each rank scores its contiguous
shard of the rows, SCORING_CHUNK rows at a time, in row order, so memory stays flat in the number of rows. A task's
`render(batch)` turns a batch of rows into one or more sides of token ids (a pair: chosen, rejected); an engine
(engines.py) scores them; each row gets a [sides, outputs] block of fp32 logits.
"""

import torch

SCORING_CHUNK = 4_096  # rows tokenized (and sorted by length) at a time


def scored_batches(job, table, columns, render, engine, progress=True):
    """(batch of rows as a dict of `columns`, their logits [rows, sides, outputs]) for this rank's shard. The bar
    counts the inputs scored (a row of pairs is two) as the engine's batches finish, not chunk by chunk: a chunk of
    thousands of reranker documents takes minutes on a CPU."""
    from tqdm.auto import tqdm

    rows = job.shard(len(table))
    part = table.select(rows) if len(rows) != len(table) else table
    with tqdm(total=len(part), desc="scoring", disable=not (progress and job.is_main), unit="input") as bar:
        for batch in part.select_columns(columns).iter(batch_size=SCORING_CHUNK):
            sides = render(batch)
            if bar.total != len(part) * len(sides):
                bar.total = len(part) * len(sides)
                bar.refresh()
            logits = engine([ids for side in sides for ids in side], bar).float()
            yield batch, logits.reshape(len(sides), len(sides[0]), -1).transpose(0, 1)


def gathered_scores(job, batches) -> torch.Tensor | None:
    """Every row's logits in row order on rank 0 (None on the other ranks)."""
    parts = [logits for _, logits in batches]
    gathered = job.gather(torch.cat(parts) if parts else None)
    return None if gathered is None else torch.cat([p for p in gathered if p is not None])
