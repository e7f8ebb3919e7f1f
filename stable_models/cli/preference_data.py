"""Preference data for reward models, in TRL's layouts, read and checked at any size (an Arrow table, checked in
batches, tokenized by a cached `map`):

- implicit prompt: `chosen` / `rejected` texts;
- explicit prompt: `prompt` + `chosen` + `rejected`;
- conversational: any of the above as lists of {"role", "content"} messages;
- optional `margin` (Llama 2's margin loss) and `subset` (RewardBench's layout, for evaluate) columns.

Each response is rendered as TRL's `RewardTrainer` renders it, so a model trained here and one trained there read the
same tokens: texts are `prompt + response`, with the tokenizer's eos appended unless it is already there;
conversations are `prompt + response` messages through the tokenizer's chat template, applied once.
"""

from dataclasses import dataclass

from .data import CHECK_BATCH, RowProblems, arrow_batches, cached_map, first_true, not_finite, require_column
from .errors import CliError

PAIR_SIDES = ("chosen", "rejected")  # the two responses of a preference pair


def is_preference(table) -> bool:
    return set(PAIR_SIDES) <= set(table.column_names)


def is_messages(arrow_type) -> bool:
    """A column of chat conversations: lists of structs with `role` and `content`."""
    import pyarrow

    if not (pyarrow.types.is_list(arrow_type) or pyarrow.types.is_large_list(arrow_type)):
        return False
    item = arrow_type.value_type
    return pyarrow.types.is_struct(item) and {"role", "content"} <= {f.name for f in item}


def is_text(arrow_type) -> bool:
    import pyarrow

    return pyarrow.types.is_string(arrow_type) or pyarrow.types.is_large_string(arrow_type)


@dataclass(frozen=True)
class PreferenceLayout:
    """Which of TRL's preference layouts a table has."""

    conversational: bool
    prompt: bool  # an explicit `prompt` column
    margin: bool
    subset: bool

    def describe(self) -> str:
        kind = "conversations" if self.conversational else "texts"
        return f"{'explicit' if self.prompt else 'implicit'} prompt, {kind}" + (", margins" if self.margin else "")


def preference_layout(table, path) -> PreferenceLayout:
    """The layout of a preference table, or a one-line error naming what is missing or mixed."""
    missing = [side for side in PAIR_SIDES if side not in table.column_names]
    if missing:
        raise CliError(
            f"{path}: no column {missing[0]!r} (columns: {', '.join(table.column_names)}); preference data needs "
            "'chosen' and 'rejected' (and optionally 'prompt', 'margin'), as in TRL"
        )
    columns = [*PAIR_SIDES] + (["prompt"] if "prompt" in table.column_names else [])
    schema = table.data.schema
    kinds = {
        key: "messages"
        if is_messages(schema.field(key).type)
        else "text"
        if is_text(schema.field(key).type)
        else str(schema.field(key).type)
        for key in columns
    }
    odd = {k: v for k, v in kinds.items() if v not in ("messages", "text")}
    if odd:
        key, kind = next(iter(odd.items()))
        raise CliError(
            f"{path}: column {key!r} holds {kind}; use texts or lists of {{'role', 'content'}} messages (TRL's layouts)"
        )
    if len(set(kinds.values())) > 1:
        raise CliError(
            f"{path}: columns mix texts and conversations ({', '.join(f'{k}: {v}' for k, v in kinds.items())}); "
            "make them one kind"
        )
    if "margin" in table.column_names:
        import pyarrow

        if not pyarrow.types.is_floating(schema.field("margin").type) and not pyarrow.types.is_integer(
            schema.field("margin").type
        ):
            raise CliError(f"{path}: column 'margin' must hold numbers (Llama 2's margin loss)")
    return PreferenceLayout(
        conversational=kinds["chosen"] == "messages",
        prompt="prompt" in columns,
        margin="margin" in table.column_names,
        subset="subset" in table.column_names,
    )


def check_pairs(table, layout: PreferenceLayout, path) -> int:
    """Refuses missing or empty responses, conversations without a final assistant turn, and implicit-prompt
    conversations whose prompts differ; returns how many pairs have chosen identical to rejected (the caller warns)."""
    import pyarrow.compute as pc

    columns = [*PAIR_SIDES] + (["prompt"] if layout.prompt else []) + (["margin"] if layout.margin else [])
    for key in columns:
        count, first = first_true(
            pc.is_null(batch.column(key), nan_is_null=True) for batch in arrow_batches(table, [key])
        )
        if count:
            raise CliError(
                f"{path}: {key!r} is missing{' or NaN' if key == 'margin' else ''} in {count} row(s), first at row "
                f"{first + 1}; fill or drop those rows"
            )
    if layout.margin:
        count, first = first_true(not_finite(batch.column("margin")) for batch in arrow_batches(table, ["margin"]))
        if count:
            raise CliError(
                f"{path}: 'margin' is not finite in {count} row(s), first at row {first + 1}: an infinite margin "
                "makes every loss infinite; fill or drop those rows"
            )
    if not layout.conversational:
        for side in PAIR_SIDES:
            count, first = first_true(
                pc.match_substring_regex(batch.column(side), r"^\s*$") for batch in arrow_batches(table, [side])
            )
            if count:
                raise CliError(
                    f"{path}: {side!r} is empty in {count} row(s), first at row {first + 1}: a pair needs both "
                    "responses; fill or drop those rows"
                )
        return first_true(pc.equal(b.column("chosen"), b.column("rejected")) for b in arrow_batches(table, PAIR_SIDES))[
            0
        ]
    return check_conversations(table, layout, path)


def check_conversations(table, layout: PreferenceLayout, path) -> int:
    """The checks that need each conversation (Python, CHECK_BATCH rows at a time)."""
    problems = RowProblems(
        {
            "empty": "a pair needs both responses, each ending in a non-empty message: fix or drop those rows",
            "no final assistant turn": "each of 'chosen' and 'rejected' must end with the assistant's response: fix "
            "or drop those rows",
            "prompts differ": "without a 'prompt' column the two conversations must share every message but the "
            "last (the implicit prompt); put the shared turns in a 'prompt' column, or drop those rows",
        },
        "pair(s)",
    )
    identical, offset = 0, 0
    for batch in table.select_columns(list(PAIR_SIDES)).iter(batch_size=CHECK_BATCH):
        for row, (chosen, rejected) in enumerate(zip(batch["chosen"], batch["rejected"], strict=True)):
            where = offset + row + 1
            for messages in (chosen, rejected):
                if not messages or not str(messages[-1].get("content") or "").strip():
                    problems.add("empty", where)
                elif messages[-1].get("role") != "assistant":
                    problems.add("no final assistant turn", where)
            if not layout.prompt and chosen and rejected and chosen[:-1] != rejected[:-1]:
                problems.add("prompts differ", where)
            identical += chosen == rejected
        offset += len(batch["chosen"])
    problems.refuse(path)
    return identical


def template_summary(tokenizer) -> str:
    """Which chat template a conversation goes through (said at train time, so a user can check it)."""
    import hashlib

    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()))
    digest = hashlib.sha256(template.encode()).hexdigest()[:12]
    return f"the tokenizer's chat template ({len(template)} characters, sha256 {digest}...; saved with the model)"


def require_template(tokenizer, model, path) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise CliError(
            f"{path} holds conversations, but the tokenizer of {model} has no chat template: use an instruct model's "
            "tokenizer, set tokenizer.chat_template and save it with the model, or give the responses as texts"
        )


def rendered_ids(tokenizer, responses, prompts, conversational: bool) -> list[list[int]]:
    """Token ids of each response, as TRL renders it: `prompt + response` texts with eos appended, or `prompt +
    response` messages through the chat template."""
    if conversational:
        return [
            list(tokenizer.apply_chat_template((p or []) + r, tokenize=True, return_dict=True)["input_ids"])
            for r, p in zip(responses, prompts or [None] * len(responses), strict=True)
        ]
    eos = tokenizer.eos_token or ""
    texts = [
        (p or "") + (r if r.endswith(eos) else r + eos)
        for r, p in zip(responses, prompts or [None] * len(responses), strict=True)
    ]
    return tokenizer(texts)["input_ids"]


def encode_pairs(batch, tokenizer, layout: PreferenceLayout):
    """One `map` batch: both responses' token ids, their total length (for the evaluation cadence), the margin."""
    prompts = batch["prompt"] if layout.prompt else None
    chosen = rendered_ids(tokenizer, batch["chosen"], prompts, layout.conversational)
    rejected = rendered_ids(tokenizer, batch["rejected"], prompts, layout.conversational)
    out = {
        "chosen_input_ids": chosen,
        "rejected_input_ids": rejected,
        "length": [len(c) + len(r) for c, r in zip(chosen, rejected, strict=True)],
        "longer": [max(len(c), len(r)) for c, r in zip(chosen, rejected, strict=True)],
    }
    if layout.margin:
        out["margin"] = [float(m) for m in batch["margin"]]
    return out


def encoded_pairs(table, tokenizer, layout: PreferenceLayout, max_length: int):
    """(pairs within max_length tokens a side, how many were dropped): TRL drops longer pairs rather than cut off
    the end of a response, which is the token a reward model reads."""
    pairs = cached_map(table, encode_pairs, "tokenizing pairs", tokenizer=tokenizer, layout=layout)
    kept = pairs.filter(lambda longer: [n <= max_length for n in longer], batched=True, input_columns="longer")
    return kept, len(pairs) - len(kept)


def response_layout(table, text_key, path) -> tuple[str, bool, bool]:
    """For scoring single responses: (the response column, conversational, an explicit prompt column). The column is
    --text-key, or `messages` where that is absent."""
    key = text_key if text_key in table.column_names or "messages" not in table.column_names else "messages"
    require_column(table, key, path, "--text-key")
    schema = table.data.schema
    conversational = is_messages(schema.field(key).type)
    if not conversational and not is_text(schema.field(key).type):
        raise CliError(f"{path}: column {key!r} holds {schema.field(key).type}; use texts or lists of messages")
    prompt = "prompt" in table.column_names and key != "prompt"
    if prompt and is_messages(schema.field("prompt").type) != conversational:
        raise CliError(f"{path}: 'prompt' and {key!r} mix texts and conversations; make them one kind")
    return key, conversational, prompt
