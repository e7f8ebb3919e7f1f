"""setup_pad_token: give a tokenizer a pad token and make the model's config agree with it.

Stable pooling reads the attention mask, so the pad id never changes a Stable model's logits; it still matters for
the stock classes, for collators that pad labels, and for anything that compares ids to `pad_token_id`.
"""

import contextlib
import re
import warnings

import torch

NEW_PAD_TOKEN = "<|pad|>"
# Tokens that exist to be padding or are reserved and never produced by the tokenizer, best first.
PREFERRED_PADS = ["<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>", "<|fim_pad|>", "<|padding|>"]
RESERVED = re.compile(r"^<\|?(reserved|unused)[_a-z]*\d*\|?>$|^\[unused\d+\]$|^<unused\d+>$")


def _reserved_pad_candidate(tokenizer) -> str | None:
    taken = {tokenizer.eos_token, tokenizer.bos_token, tokenizer.unk_token} - {None}
    vocab = tokenizer.get_vocab()
    for token in PREFERRED_PADS:
        if token in vocab and token not in taken:
            return token
    reserved = sorted((vocab[t], t) for t in vocab if RESERVED.match(t) and t not in taken)
    return reserved[0][1] if reserved else None


def _choose_pad(tokenizer, can_resize: bool) -> tuple[str, str | None]:
    """(token, warning or None). Order: the tokenizer's own pad unless it is eos; an unused/reserved token; unk;
    a new token (only with a model to resize, and only if the tokenizer has no pad at all); eos, with a warning."""
    own = tokenizer.pad_token
    if own is not None and own != tokenizer.eos_token:
        return own, None
    why = f"its pad token was eos ({own!r})" if own is not None else "it had no pad token"
    if (candidate := _reserved_pad_candidate(tokenizer)) is not None:
        return candidate, f"setup_pad_token: {why}; using the unused token {candidate!r} as pad."
    if tokenizer.unk_token is not None:
        return tokenizer.unk_token, f"setup_pad_token: {why}; using unk ({tokenizer.unk_token!r}) as pad."
    if own is None and (can_resize or tokenizer.eos_token is None):
        return NEW_PAD_TOKEN, None
    return tokenizer.eos_token, (
        f"setup_pad_token: pad is eos ({tokenizer.eos_token!r}), the only usable token. Stable classes pool from "
        "attention_mask, so pad == eos cannot change their logits; the stock classes skip a trailing eos and pool "
        "the token before it."
    )


ADDED = f"setup_pad_token: the tokenizer had no pad, unk, eos or reserved token; added {NEW_PAD_TOKEN!r}"


def _add_pad_row(tokenizer, model, model_follows: bool = False) -> None:
    """Add NEW_PAD_TOKEN and grow the embeddings; the new row is the fp32 mean of the existing rows."""
    tokenizer.add_special_tokens({"pad_token": NEW_PAD_TOKEN})
    if model is None:
        if not model_follows:
            warnings.warn(ADDED + ". Call setup_pad_token(tokenizer, model) to resize the model too.", stacklevel=3)
        return
    _grow_rows(tokenizer, model)
    warnings.warn(ADDED + f" (id {tokenizer.pad_token_id}) and set its embedding to the mean row.", stacklevel=3)


def _grow_rows(tokenizer, model) -> None:
    """The embedding table grown to the tokenizer; the new rows are the fp32 mean of the existing rows."""
    old_rows = embedding_rows(model)
    if tokenizer.pad_token_id >= old_rows:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        weight = model.get_input_embeddings().weight
        with torch.no_grad(), whole(weight):
            weight[old_rows:] = weight[:old_rows].float().mean(0).to(weight.dtype)


def embedding_rows(model) -> int:
    """Rows of the input embedding table (DeepSpeed ZeRO-3 keeps the full shape as ds_shape; the tensor is a slice)."""
    weight = model.get_input_embeddings().weight
    return getattr(weight, "ds_shape", weight.shape)[0]


def whole(weight):
    """The full parameter while inside (gathered from its ZeRO-3 slices, rank 0's change kept); elsewhere a no-op."""
    if not hasattr(weight, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([weight], modifier_rank=0)


def setup_pad_token(tokenizer, model=None, *, model_follows: bool = False) -> int:
    """Make sure `tokenizer` has a pad token and `model.config` (and generation_config) use its id. Idempotent.

    `model_follows`: the tokenizer is set up before its model is loaded (to tokenize first); it chooses as it would
    with the model, and the later setup_pad_token(tokenizer, model) grows the embeddings for a pad token it added.
    Raises ValueError if the pad id does not fit the model's embedding table. Returns the pad token id.
    """
    token, note = _choose_pad(tokenizer, can_resize=model is not None or model_follows)
    if token == NEW_PAD_TOKEN and tokenizer.pad_token != NEW_PAD_TOKEN:
        _add_pad_row(tokenizer, model, model_follows)
    elif tokenizer.pad_token != token:
        tokenizer.pad_token = token
        if note:
            warnings.warn(note, stacklevel=2)
    elif note and tokenizer.pad_token == tokenizer.eos_token:
        warnings.warn(note, stacklevel=2)
    pad_id = tokenizer.pad_token_id
    if model is None:
        return pad_id
    if tokenizer.pad_token == NEW_PAD_TOKEN and pad_id >= embedding_rows(model):  # added before the model came
        _grow_rows(tokenizer, model)
        warnings.warn(f"{ADDED} (id {pad_id}) and set its embedding to the mean row.", stacklevel=2)
    rows = embedding_rows(model)
    if pad_id >= rows:
        raise ValueError(
            f"pad token {tokenizer.pad_token!r} has id {pad_id}, outside the model's embedding table ({rows} rows): "
            "this tokenizer does not belong to this model, or tokens were added without "
            "model.resize_token_embeddings(len(tokenizer))."
        )
    configs = [model.config, getattr(model, "generation_config", None)]
    for config in filter(None, configs):
        if config.pad_token_id not in (None, pad_id):
            warnings.warn(
                f"setup_pad_token: {type(config).__name__}.pad_token_id was {config.pad_token_id}, the tokenizer pads "
                f"with {pad_id}; set it to {pad_id}.",
                stacklevel=2,
            )
        config.pad_token_id = pad_id
    return pad_id


NO_EOS = (
    "{name} has no eos token, and last-token pooling needs a token every text ends with (else a text's vector is its "
    "last word's state, and a consumer that adds one reads another token). Set tokenizer.eos_token to the model's "
    "end-of-text token, or pool the mean (pooling='mean')."
)


def ends_with_eos(tokenizer) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[-1] == tokenizer.eos_token_id


def prompt_length(tokenizer, prompt: str) -> int:
    """How many first tokens of `prompt + text` an embedder with `include_prompt=False` leaves out of its mean:
    sentence-transformers' count (the prompt tokenized alone, less a special token it ends with), so both leave out the
    same tokens. 0 for no prompt (sentence-transformers then passes none)."""
    if not prompt:
        return 0
    ids = tokenizer(prompt)["input_ids"]
    return len(ids) - (1 if ids and ids[-1] in set(tokenizer.all_special_ids) else 0)


def append_eos(tokenizer) -> bool:
    """Make `tokenizer(text)` end with its eos token, in the tokenizer itself, so that every consumer that tokenizes
    with the saved tokenizer (sentence-transformers, vLLM, transformers) pools the same last token (Qwen3-Embedding's
    fix for its #122). Its post-processor becomes one template: the special tokens it added before (a bos), the text,
    eos; saved in tokenizer.json. Returns whether anything changed; a ValueError where it has no eos token."""
    if tokenizer.eos_token_id is None:
        raise ValueError(NO_EOS.format(name=type(tokenizer).__name__))
    if ends_with_eos(tokenizer):
        return False
    from tokenizers import processors

    plain, added = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    start = next(i for i in range(len(added)) if added[i : i + len(plain)] == plain)
    before = [tokenizer.convert_ids_to_tokens(i) for i in added[:start]]
    eos = tokenizer.eos_token
    specials = {token: tokenizer.convert_tokens_to_ids(token) for token in [*before, eos]}
    head = "".join(f"{token}:0 " for token in before)
    with contextlib.suppress(AttributeError, ValueError):  # its own switches would rebuild the template on load
        tokenizer.add_eos_token = False
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{head}$A:0 {eos}:0", pair=f"{head}$A:0 {eos}:0 $B:1 {eos}:1", special_tokens=list(specials.items())
    )
    if tokenizer("a")["input_ids"] != added[:start] + plain + [tokenizer.eos_token_id]:
        raise ValueError(f"{type(tokenizer).__name__}: could not make it append {eos!r}")
    return True
