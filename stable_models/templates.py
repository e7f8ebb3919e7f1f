"""How a reranker's (query, document) becomes token ids, written so that every consumer of the saved folder can render
it the same way.

`pair` is the tokenizer's text pair (what vLLM and sentence-transformers do without a template). A format string
(`qwen3` is Qwen3-Reranker's) is rendered to one text and tokenized whole, without added special tokens: that is what
`tokenizer.apply_chat_template` does, so the folder's chat template (`chat_template`, saved as `chat_template.jinja`
with `query` and `document` roles) gives sentence-transformers and vLLM the ids training used. An over-long input keeps
the tokens after the document (the template's end) and cuts the document, as sentence-transformers' suffix-restoring
truncation does.
"""

import hashlib
import json
import string

QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3 = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"
    "<think>\n\n</think>\n\n"
)
TEMPLATES = {"pair": "pair", "qwen3": QWEN3}  # built-in names; any other template is a format string
FIELDS = ("query", "document", "instruction")
MARKER = "stable_models reranker template"  # the chat template's first comment: which templates this library wrote


class RerankTemplate:
    """`pair`, `qwen3` or a format string with {query} and {document} (and optionally {instruction}); a ValueError
    names what is wrong with any other."""

    def __init__(self, text: str, instruction: str | None = None):
        self.text = TEMPLATES.get(text, text)
        self.instruction = instruction if instruction is not None else QWEN3_INSTRUCTION
        self.parts = [] if self.text == "pair" else parse(self.text)

    @property
    def is_pair(self) -> bool:
        return self.text == "pair"

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.text}\0{self.instruction}".encode()).hexdigest()[:12]

    @property
    def document_is_last(self) -> bool:
        """Whether nothing but template text follows {document}: consumers that keep a template's end when they cut
        (sentence-transformers) then cut where this does."""
        fields = [field for _, field in self.parts if field]
        return fields[-1] == "document"

    def describe(self) -> str:
        if self.is_pair:
            return f"the tokenizer's text pair (query, document) (sha256 {self.digest}...)"
        instruction = f", instruction {self.instruction!r}" if "instruction" in self.fields else ""
        return f"template of {len(self.text)} characters{instruction} (sha256 {self.digest}...)"

    @property
    def fields(self) -> set:
        return {field for _, field in self.parts if field}

    def render(self, query: str, document: str, instruction: str | None = None) -> tuple[str, int, int]:
        """The text of one pair, and the characters where the document starts and ends (what follows is the
        template's end)."""
        values = {"query": query, "document": document, "instruction": instruction or self.instruction}
        text, start, end = "", 0, 0
        for literal, field in self.parts:
            text += literal
            if field == "document":
                start = len(text)
            if field:
                text += values[field]
            if field == "document":
                end = len(text)
        return text, start, end

    def ids(self, tokenizer, queries, documents, limit: int, instructions=None) -> tuple[list[list[int]], list[int]]:
        """(token ids of each (query, document) within `limit`, each row's full length where it was cut (0
        elsewhere))."""
        if self.is_pair:
            return pair_ids(tokenizer, queries, documents, limit)
        rendered = [
            self.render(q, d, i)
            for q, d, i in zip(queries, documents, instructions or [None] * len(queries), strict=True)
        ]
        encoded = tokenizer([text for text, _, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
        out, cut_from = [], []
        for (_, start, end), ids, offsets in zip(
            rendered, encoded["input_ids"], encoded["offset_mapping"], strict=True
        ):
            if len(ids) <= limit:
                out.append(ids)
                cut_from.append(0)
                continue
            head = sum(1 for first, _ in offsets if first < start)  # the tokens before the document
            tail = len(ids) - next((j for j, (first, _) in enumerate(offsets) if first >= end), len(ids))
            if head + tail >= limit:
                raise ValueError(f"a query and the template take {head + tail} tokens, more than the {limit} allowed")
            out.append(ids[: limit - tail] + ids[len(ids) - tail :])
            cut_from.append(len(ids))
        return out, cut_from

    def chat_template(self, original: str | None = None) -> str:
        """A Jinja chat template that renders messages with the roles `query` and `document` as `render` does (an
        `instruction` keyword, as vLLM's score API passes it, replaces the saved one), and any other conversation
        with the tokenizer's `original` template (or an error where there is none)."""
        pieces = []
        for literal, field in self.parts:
            if literal:
                pieces.append("{{ " + json.dumps(literal) + " }}")
            if field == "instruction":
                saved = json.dumps(self.instruction)
                pieces.append("{{ instruction if instruction is defined and instruction else " + saved + " }}")
            elif field:
                pieces.append("{{ content(" + field + ") }}")
        original = the_original(original)
        other = original if original else NO_OTHER
        return (
            f"{{#- {MARKER} (sha256 {self.digest}): edit config.json's reranker_template, not this -#}}\n"
            "{%- macro content(message) -%}{%- if message.content is string -%}{{ message.content }}{%- else -%}"
            "{%- for part in message.content -%}{{ part.text }}{%- endfor -%}{%- endif -%}{%- endmacro -%}\n"
            '{%- set query = messages | selectattr("role", "equalto", "query") | first -%}\n'
            '{%- set document = messages | selectattr("role", "equalto", "document") | first -%}\n'
            "{%- if query is defined and document is defined -%}\n"
            + "".join(pieces)
            + "\n{%- else -%}\n"
            + other
            + "\n{%- endif -%}\n"
        )


NO_OTHER = "{{ raise_exception('this reranker renders query and document messages') }}"


def the_original(chat_template: str | None) -> str | None:
    """The tokenizer's own chat template inside one this library wrote (a reranker trained from a reranker)."""
    if not chat_template or MARKER not in chat_template.split("\n", 1)[0]:
        return chat_template
    other = chat_template.split("\n{%- else -%}\n", 1)[1].rsplit("\n{%- endif -%}\n", 1)[0]
    return None if other == NO_OTHER else other


def parse(text: str) -> list[tuple[str, str | None]]:
    """A format string as (literal text, field or None) pairs; a ValueError for anything render cannot express."""
    try:
        raw = list(string.Formatter().parse(text))
    except ValueError as error:
        raise ValueError(f"template {text!r}: {error}") from None
    fields = [field for _, field, _, _ in raw if field is not None]
    unknown = [f for f in fields if f not in FIELDS]
    if "query" not in fields or "document" not in fields or unknown:
        extra = f" ({', '.join('{' + f + '}' for f in unknown)} is not one of them)" if unknown else ""
        raise ValueError(
            f"template {text!r}: use pair, qwen3, or a format string with {{query}} and {{document}} (and optionally "
            f"{{instruction}}){extra}"
        )
    if any(spec or conversion for _, _, spec, conversion in raw) or fields.count("document") > 1:
        raise ValueError(f"template {text!r}: fields take no format spec or conversion, and {{document}} comes once")
    return [(literal, field) for literal, field, _, _ in raw]


def pair_ids(tokenizer, queries, documents, limit):
    full = tokenizer(list(queries), list(documents))["input_ids"]
    cut_from = [len(ids) if len(ids) > limit else 0 for ids in full]
    if not any(cut_from):
        return full, cut_from
    cut = tokenizer(list(queries), list(documents), truncation="only_second", max_length=limit)["input_ids"]
    return cut, cut_from


def adds_special_tokens(tokenizer) -> list[str]:
    """The special tokens the tokenizer adds around a single text (a bos): what vLLM's score API prepends to a
    rendered pair, which it tokenizes with add_special_tokens=True."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    added = tokenizer("a")["input_ids"]
    return [] if added == plain else tokenizer.convert_ids_to_tokens([i for i in added if i not in plain])


def attach_template(model, tokenizer, template: RerankTemplate) -> None:
    """Make a reranker's folder carry its template: `config.json` keeps the template and instruction (what evaluate
    and predict read), and, for a format string, the tokenizer's chat template renders `query` and `document`
    messages as training did (what sentence-transformers and vLLM read); it still renders every other conversation
    with the tokenizer's own chat template. `stable_models.consumers.consumer_table` says what each consumer does
    with the folder."""
    model.config.reranker_template, model.config.reranker_instruction = template.text, template.instruction
    original = the_original(getattr(tokenizer, "chat_template", None))
    tokenizer.chat_template = original if template.is_pair else template.chat_template(original)
