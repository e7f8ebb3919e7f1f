"""Small offline tokenizers with the special-token behaviour of real ones (built with the `tokenizers` library)."""

import inspect
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

WORDS = "the a film movie was is great bad dull fine plot actor good awful not very and but it i loved hated".split()


def build(specials, padding_side="right", bos=None, **roles):
    """A whitespace word-level tokenizer: special tokens first (ids 0..), then WORDS. `roles`: pad_token=..., etc."""
    vocab = {token: i for i, token in enumerate([*specials, *WORDS, "<internal-unk>"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<internal-unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos is not None:  # Gemma prepends bos
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, padding_side=padding_side, **roles)
    tokenizer.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in roles.values()]})
    return tokenizer


def qwen2_like():
    """Qwen2: pad <|endoftext|>, eos <|im_end|>, right padding, no unk. A byte-level BPE learned from WORDS, built as
    transformers' own Qwen2 tokenizer class where it takes vocab and merges (5.x): AutoTokenizer reloads a folder with
    a qwen2 config as that class, which re-creates the backend from vocab and merges (a word-level fixture reloads
    as garbage: "the film was great" -> ['i', 'a', 'a'])."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([" ".join(WORDS), *WORDS] * 4, trainer)
    roles = dict(pad_token="<|endoftext|>", eos_token="<|im_end|>")
    if "vocab" in inspect.signature(Qwen2Tokenizer.__init__).parameters:
        model = json.loads(backend.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, unk_token=None, **roles)
    else:  # transformers 4.x: the fast class loads tokenizer.json as it is
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, padding_side="right", **roles)
    tokenizer.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in roles.values()]})
    return tokenizer


def gemma_like():
    """Gemma: pad <pad> (id 0), eos <eos>, bos prepended, unk, left padding."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    return build(
        specials, "left", bos="<bos>", pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )


def llama_pad_is_eos(reserved=False):
    """SmolLM2-style: pad == eos (<|im_end|>), no unk; optionally a Llama-3-style reserved token."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + (["<|reserved_special_token_0|>"] if reserved else [])
    return build(specials, "right", pad_token="<|im_end|>", eos_token="<|im_end|>", bos_token="<|im_start|>")


def no_pad():
    """Llama-3-base-style: bos and eos only, no pad, no unk, no reserved token."""
    return build(
        ["<|begin_of_text|>", "<|end_of_text|>"], "right", bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )
