"""Padding-free batches for classification and reward modelling: several examples per row, position ids restarting
at every example, rows of at most `max_tokens` tokens.

`Trainer(..., data_collator=stable_models.PackedCollator())` packs each batch into rows, so almost no compute is
spent on padding; Stable classes pool each example separately, and every example gets its unpadded logits, in the
order of the features (`logits[i]` belongs to feature i).

The batch format (documented in the README, checked by the Stable forward):
- `input_ids`, `position_ids` (rows, length): examples laid end to end, positions 0, 1, 2, ... for each;
- `attention_mask` (rows, length), only when some row is shorter than the longest: 1 on tokens, 0 on the padding at
  the end of a row;
- `packed_example_index` (examples,): feature index of each example in row-major order (first-fit decreasing moves
  them), used by the Stable forward to put logits back in feature order;
- `labels` (examples,) in feature order.
With a single row and no padding only `input_ids` and `position_ids` are needed (the old one-row format).
"""

import torch
import torch.nn.functional as F

DEFAULT_MAX_TOKENS = "longest"  # see PackedCollator


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices grouped into bins of total length <= capacity (a longer item gets a bin of its own)."""
    bins, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[index] <= free:
                bins[b].append(index)
                room[b] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(capacity - lengths[index])
    return bins


def rows_near_the_longest(lengths: list[int]) -> list[list[int]]:
    """Rows for `max_tokens="longest"`: first-fit decreasing at the longest example's length, or at a wider capacity
    where that takes fewer rows and fewer row x width tokens, as long as the attention work (rows x width^2, what
    eager and sdpa compute) stays within the plain packing's. Padding fragments a few short rows into one more row,
    which costs most at small batches (batch 8: 82 % of the tokens are real at the longest length)."""
    longest, total = max(lengths), sum(lengths)

    def width(rows):
        return max(sum(lengths[i] for i in row) for row in rows)

    best = first_fit_decreasing(lengths, longest)
    best_tokens = len(best) * longest  # the longest example fills its row
    attention_limit = best_tokens * longest
    for count in range(len(best) - 1, 0, -1):
        floor = max(longest, -(-total // count))
        if count * floor**2 > attention_limit:
            break  # fewer, wider rows only add attention work from here on
        for step in range(17):  # a little room above total / count absorbs the fragmentation
            rows = first_fit_decreasing(lengths, floor + step * max(1, floor // 32))
            if len(rows) <= count:
                break
        rows_width = width(rows)
        tokens = len(rows) * rows_width
        if len(rows) <= count and tokens * rows_width <= attention_limit and tokens < best_tokens:
            best, best_tokens = rows, tokens
    return best


class PackedCollator:
    """Collate features with `input_ids` (and `labels`/`label`) into packed rows of at most `max_tokens` tokens.

    The default, `"longest"`, makes rows about as long as the batch's longest example (the short examples fill the
    rows around the long ones), a little longer only where that saves a row without adding attention work: eager and
    sdpa build a dense row x row mask and score matrix, quadratic in the row's length, so the batch never costs more
    attention or activation memory than padding, where one row of the whole batch grows with the square of the batch
    (`./dev bench --only packing`). `max_tokens=N` caps rows at N tokens (an example longer than N gets a row of its
    own); `None` puts the whole batch in one row.
    """

    def __init__(self, max_tokens: int | str | None = DEFAULT_MAX_TOKENS, pad_token_id: int = 0):
        if not (max_tokens is None or max_tokens == "longest" or (isinstance(max_tokens, int) and max_tokens >= 1)):
            raise ValueError(
                f"PackedCollator: max_tokens={max_tokens!r} must be a positive number of tokens, 'longest' or None."
            )
        self.max_tokens = max_tokens
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        ids = token_ids(features)
        return self.rows_of([(t, torch.arange(len(t)), [i]) for i, t in enumerate(ids)], features)

    def rows_of(self, units: list[tuple], features: list[dict]) -> dict:
        """The batch from units laid end to end in rows: (token ids, position ids, the features whose examples the
        unit holds, in order); a unit is one example, or a shared prefix and the examples continuing it."""
        lengths = [len(unit[0]) for unit in units]
        capacity = {None: sum(lengths), "longest": max(lengths)}.get(self.max_tokens, self.max_tokens)
        if sum(lengths) <= capacity:  # one row, in the order given
            rows = [list(range(len(units)))]
        elif self.max_tokens == "longest":
            rows = rows_near_the_longest(lengths)
        else:
            rows = first_fit_decreasing(lengths, capacity)
        width = max(sum(lengths[i] for i in row) for row in rows)
        input_ids, positions, mask = [], [], []
        for row in rows:
            used = sum(lengths[i] for i in row)
            input_ids.append(F.pad(torch.cat([units[i][0] for i in row]), (0, width - used), value=self.pad_token_id))
            positions.append(F.pad(torch.cat([units[i][1] for i in row]), (0, width - used)))
            mask.append(torch.arange(width) < used)
        batch = {"input_ids": torch.stack(input_ids), "position_ids": torch.stack(positions)}
        if not all(m.all() for m in mask):
            batch["attention_mask"] = torch.stack(mask).long()
        order = [example for row in rows for i in row for example in units[i][2]]
        if order != list(range(len(features))):
            batch["packed_example_index"] = torch.tensor(order)
        key = "labels" if "labels" in features[0] else "label" if "label" in features[0] else None
        if key is not None:
            batch["labels"] = torch.stack([torch.as_tensor(f[key]) for f in features])
        return batch


def token_ids(features: list[dict]) -> list[torch.Tensor]:
    ids = [torch.as_tensor(f["input_ids"], dtype=torch.long).flatten() for f in features]
    empty = [i for i, t in enumerate(ids) if len(t) == 0]
    if empty:
        raise ValueError(f"PackedCollator: examples {empty[:10]} have no tokens; drop empty texts before training.")
    return ids


class PackedPairCollator(PackedCollator):
    """Padding-free reward modelling: features with `chosen_input_ids` and `rejected_input_ids` (TRL's tokenized
    preference format) become packed rows of all 2N responses, with `labels` 1 for chosen and 0 for rejected, in the
    order chosen_0, rejected_0, chosen_1, ..., and `margin` (one per pair) when the features have one. Use with a
    Stable model with num_labels=1 and `Trainer(compute_loss_func=stable_models.bradley_terry_loss,
    data_collator=PackedPairCollator())` (a `margin` needs stable_models' PairwiseTrainer, which passes it on)."""

    def __call__(self, features: list[dict]) -> dict:
        batch = super().__call__(pair_responses(features))
        if "margin" in features[0]:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features])
        return batch


def pair_responses(features: list[dict]) -> list[dict]:
    """chosen_0, rejected_0, chosen_1, ... as single responses labelled 1 (chosen) and 0 (rejected)."""
    responses = []
    for feature in features:
        responses.append({"input_ids": feature["chosen_input_ids"], "labels": torch.tensor(1)})
        responses.append({"input_ids": feature["rejected_input_ids"], "labels": torch.tensor(0)})
    return responses


class PaddedPairCollator:
    """The same batches as PackedPairCollator, padded (recurrent models; `--no-packing`): both responses of each pair
    in its order and labels, and the margins."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict]) -> dict:
        batch = padded(self.tokenizer, pair_responses(features))
        if "margin" in features[0]:
            batch["margin"] = torch.tensor([float(f["margin"]) for f in features])
        return batch


def padded(tokenizer, examples: list[dict]) -> dict:
    """Single examples (token ids and a label each) as one padded batch."""
    batch = dict(tokenizer.pad({"input_ids": [e["input_ids"] for e in examples]}, return_tensors="pt"))
    batch["labels"] = torch.stack([e["labels"] for e in examples])
    return batch


class PackedGroupCollator(PackedCollator):
    """Padding-free reranking: features are query groups, each with `input_ids` (one token-id list per document) and
    `relevance` (one per document), optionally `teacher` scores. Every document of the batch goes into packed rows
    (a group is never split across batches), with `labels` = the relevances in feature order, `group_sizes` and
    `teacher` for `stable_models.ranking_loss` (`RankingTrainer` passes them on).

    `share_prefixes=True` computes the tokens a group's documents start with (the template's head and the query) once
    per group: the prefix, then each document's own tokens with positions continuing the prefix's, up to
    `prefix_unit_tokens` tokens a unit (a larger group repeats the prefix). The Stable forward then gives every
    document the logits it has alone (last-token pooling, full attention with an eager or sdpa kernel; other models
    refuse such batches, see `stable_models.modeling_rules.shared_prefix_obstacle`).
    """

    def __init__(
        self, max_tokens=DEFAULT_MAX_TOKENS, pad_token_id: int = 0, share_prefixes=False, prefix_unit_tokens=1024
    ):
        super().__init__(max_tokens, pad_token_id)
        self.share_prefixes = share_prefixes
        self.prefix_unit_tokens = prefix_unit_tokens

    def __call__(self, features: list[dict]) -> dict:
        documents = group_documents(features)
        if not self.share_prefixes:
            return with_group_columns(super().__call__(documents), features)
        ids, units, first = token_ids(documents), [], 0
        for feature in features:
            count = len(feature["input_ids"])
            units += shared_prefix_units(ids[first : first + count], first, self.prefix_unit_tokens)
            first += count
        return with_group_columns(self.rows_of(units, documents), features)


def shared_prefix_units(ids: list[torch.Tensor], first: int, unit_tokens: int) -> list[tuple]:
    """One group's documents (feature indices from `first`) as units of their common first tokens followed by each
    document's own tokens (at least one each, so that each ends on its own last token)."""
    shortest = min(len(t) for t in ids)
    prefix = shortest - 1
    for t in ids[1:]:
        differs = (t[:prefix] != ids[0][:prefix]).nonzero()
        prefix = int(differs[0]) if len(differs) else prefix
    if len(ids) == 1 or prefix == 0:
        return [(t, torch.arange(len(t)), [first + i]) for i, t in enumerate(ids)]
    capacity = max(unit_tokens, max(len(t) for t in ids))
    units, tokens, positions, members = [], [], [], []
    for i, t in enumerate(ids):
        if members and prefix + sum(len(own) for own in tokens) + len(t) - prefix > capacity:
            units.append(prefix_unit(ids[0][:prefix], tokens, positions, members))
            tokens, positions, members = [], [], []
        tokens.append(t[prefix:])
        positions.append(torch.arange(prefix, len(t)))
        members.append(first + i)
    units.append(prefix_unit(ids[0][:prefix], tokens, positions, members))
    return units


def prefix_unit(prefix, tokens, positions, members) -> tuple:
    return torch.cat([prefix, *tokens]), torch.cat([torch.arange(len(prefix)), *positions]), members


class PaddedGroupCollator:
    """The same batches as PackedGroupCollator, padded (recurrent models; `--no-packing`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict]) -> dict:
        return with_group_columns(padded(self.tokenizer, group_documents(features)), features)


def group_documents(features: list[dict]) -> list[dict]:
    """Every document of every group, in order, as a single example labelled with its relevance."""
    return [
        {"input_ids": ids, "labels": torch.tensor(float(relevance))}
        for feature in features
        for ids, relevance in zip(feature["input_ids"], feature["relevance"], strict=True)
    ]


def with_group_columns(batch: dict, features: list[dict]) -> dict:
    batch["group_sizes"] = torch.tensor([len(f["input_ids"]) for f in features])
    if "teacher" in features[0]:
        batch["teacher"] = torch.tensor([float(t) for f in features for t in f["teacher"]])
    return batch
