"""The embedding task (issue 58): an embedding model trained contrastively on queries, positives and hard negatives,
InfoNCE over the whole global batch (`stable_models.embedding_training`), its prompts saved with it; evaluated by
retrieval over the file's documents; `predict` writes an `embedding` per row.

Never chosen by `--task auto`: its files are the reranker's layouts (and sentence-transformers' anchor / positive),
so `--task embedding` names it.
"""

import sys
import warnings
from dataclasses import dataclass
from functools import partial

import torch

from ..model_kinds import EMBEDDER_KIND
from ..modeling_files import EMBEDDER, model_kind
from .data import check_texts, column_max
from .embedding_data import read_groups_checked, tokenized, training_rows
from .errors import CliError
from .ranking_data import bm25_hits, corpus_documents, mined_groups
from .task_steps import (
    Evaluation,
    Options,
    Task,
    TrainingData,
    copied_rows,
    held_out,
    keep_trained_length,
    positions,
    read_in,
)

CUTOFFS = (1, 10, 20, 100)  # recall@20 / @100: a reranker's depths over this first stage; NDCG@10, MRR@10 its quality


@dataclass(frozen=True)
class EmbeddingOptions(Options):
    query_prompt: str | None = read_in("train")
    document_prompt: str | None = read_in("train")
    include_prompt: bool | None = read_in("train")
    temperature: float | None = read_in("train")
    mine_negatives: int | None = read_in("train")
    corpus: str | None = read_in("train", "evaluate")
    text_key: str | None = read_in("predict")
    prompt_name: str | None = read_in("predict")


@dataclass(frozen=True)
class EmbedTexts:
    """What predict embeds: a text per row, after the saved prompt `--prompt-name` names."""

    key: str
    prompt: str
    limit: int
    prompt_tokens: int = 0  # left out of the mean (an include_prompt=False embedder): the prompt's tokens


@dataclass(frozen=True)
class Retrieval:
    """What evaluate embeds: each group's query (after the query prompt) and every distinct document of the file and
    of --corpus; the untrained start (the card's base_model, where it is a local folder) is embedded the same way."""

    prompts: dict
    limit: int
    tokenizer: object
    base_model: str | None
    prompt_tokens: dict | None = None  # per prompt name, as EmbedTexts.prompt_tokens


def prompts_of(options) -> dict:
    return {"query": options.query_prompt or "", "document": options.document_prompt or ""}


def left_out_prompt_tokens(config, tokenizer) -> dict | None:
    """{prompt name: its tokens} where the embedder leaves its prompts out of the mean (include_prompt=False), counted
    as sentence-transformers counts them; None where the prompts count."""
    from ..tokenization import prompt_length

    if getattr(config, "embedding_include_prompt", True):
        return None
    return {name: prompt_length(tokenizer, p) for name, p in (getattr(config, "embedding_prompts", None) or {}).items()}


class Embedding(Task):
    name = "embedding"
    kind = "embedders"
    noun = "queries"
    Options = EmbeddingOptions
    model_kind = EMBEDDER_KIND
    calibrates = False  # cosine similarities: no temperature to fold into a head
    summary_keys = ("loss",)
    token_columns = ("query_input_ids", "positive_input_ids", "negative_input_ids")

    def claims(self, table) -> bool:
        return False  # the reranker's layouts: --task embedding names it

    def owns_model(self, config) -> bool:
        return model_kind(config) == EMBEDDER

    # --- train
    def read(self, options, table, say) -> TrainingData:
        groups, layout = read_groups_checked(table, options, options.train)
        groups = mined_groups(groups, options, say)
        groups, eval_groups, _ = held_out(
            options, groups, lambda t: (read_groups_checked(t, options, options.eval)[0], None)
        )
        rows = training_rows(groups), training_rows(eval_groups)
        return TrainingData(self, *rows, "embedding", ["vector"], options, layout)

    def model_options(self, options, data) -> dict:
        left_out = {} if options.include_prompt is not False else {"include_prompt": False}
        return {"prompts": prompts_of(options), **left_out}

    def describe_model(self, data) -> str:
        return "contrastive embedding"

    def prepare(self, options, data, tokenizer, say) -> None:
        """The saved tokenizer ends every text with eos where the vector is the last token's; a prompt that fills
        --max-length alone is refused."""
        from ..tokenization import append_eos

        if options.include_prompt is False and options.pooling != "mean":
            raise CliError(
                "--no-include-prompt leaves the prompt out of a mean: add --pooling mean (last-token pooling reads "
                "one token, never the prompt's)"
            )
        if (options.pooling or "last") == "last":
            try:
                if append_eos(tokenizer):
                    say(f"[train] the tokenizer appends {tokenizer.eos_token!r} to every text (saved)", file=sys.stderr)
            except ValueError as error:
                raise CliError(f"--pooling last: {error}") from None
        for name, prompt in prompts_of(options).items():
            used = len(tokenizer(prompt)["input_ids"])
            if options.max_length and prompt and used >= options.max_length:
                raise CliError(
                    f"--{name}-prompt is {used} tokens, and --max-length {options.max_length} leaves no room for the "
                    "text: shorten the prompt or raise --max-length"
                )
        say(f"[train] {data.details.describe()}, InfoNCE over the global batch", file=sys.stderr)

    def tokenize(self, options, tokenizer, limit, data, say) -> tuple:
        sets = [tokenized(rows, tokenizer, prompts_of(options), limit) for rows in (data.train, data.eval)]
        keep_trained_length(tokenizer, limit)
        return tuple(sets)

    def longest(self, train_set, tokenizer) -> int:
        return column_max(train_set, "length")

    def collator(self, tokenizer, packing: bool, model):
        """Packed rows without padding, where the model takes them (padded for recurrent models, --no-packing)."""
        from ..embedding_training import EmbeddingCollator

        left_out = left_out_prompt_tokens(model.config, tokenizer)
        return EmbeddingCollator(tokenizer, packing=packing, prompt_tokens=left_out)

    def trainer_class(self):
        from ..embedding_training import EmbeddingTrainer

        return EmbeddingTrainer

    def trainer_options(self, options, data, eval_set) -> dict:
        from ..losses import InfoNCELoss

        return {"loss": InfoNCELoss(options.temperature or 0.05)}

    def compute_metrics(self, data):
        return None  # the eval loss (InfoNCE over each eval batch) picks the best checkpoint

    def best_metric(self, data):
        return "loss", False

    def preflight_examples(self, data, train_set) -> tuple:
        first = train_set[: min(8, len(train_set))]
        ids = first["query_input_ids"] + first["positive_input_ids"]
        return ids, [0.0] * len(ids), torch.float32

    # --- evaluate and predict
    def evaluation_input(self, options, table, config, tokenizer, say) -> Retrieval:
        limit = min(tokenizer.model_max_length, positions(config))
        prompts = dict(getattr(config, "embedding_prompts", None) or {})
        left_out = left_out_prompt_tokens(config, tokenizer)
        return Retrieval(prompts, limit, tokenizer, untrained_start(options.model), left_out)

    def prediction_input(self, options, table, config, tokenizer, say) -> EmbedTexts:
        key = options.text_key or "text"
        check_texts(table, options.data, key, None)
        prompts = getattr(config, "embedding_prompts", None) or {}
        prompt = prompts.get(options.prompt_name, "") if options.prompt_name else ""
        left_out = (left_out_prompt_tokens(config, tokenizer) or {}).get(options.prompt_name, 0)  # 0: no prompt
        return EmbedTexts(key, prompt, min(tokenizer.model_max_length, positions(config)), left_out)

    def scored_table(self, options, table, scoring):
        """evaluate: every group's query, then every distinct document of the file, with each query's relevant
        documents; predict: the file's rows."""
        if isinstance(scoring, EmbedTexts):
            return table
        from datasets import Dataset

        groups, _ = read_groups_checked(table, options, options.data)
        documents: dict[str, int] = {}
        for docs in groups["documents"]:
            for document in docs:
                documents.setdefault(document, len(documents))
        for document in corpus_documents(options.corpus, options.encoding) if options.corpus else ():
            documents.setdefault(document, len(documents))
        rows = {"text": [], "query": [], "relevant": []}
        for query, docs, relevance in zip(groups["query"], groups["documents"], groups["relevance"], strict=True):
            rows["text"].append(query)
            rows["query"].append(True)
            rows["relevant"].append([documents[d] for d, r in zip(docs, relevance, strict=True) if r > 0])
        for document in documents:
            rows["text"].append(document)
            rows["query"].append(False)
            rows["relevant"].append([])
        return Dataset.from_dict(rows)

    def scored_columns(self, scoring, options) -> list[str]:
        return [scoring.key] if isinstance(scoring, EmbedTexts) else ["text", "query"]

    def render(self, scoring, tokenizer, options, cuts):
        from ..scoring import Prompted

        cut = {"truncation": True, "max_length": scoring.limit}
        if isinstance(scoring, EmbedTexts):

            def render_texts(batch):
                ids = tokenizer([scoring.prompt + str(t) for t in batch[scoring.key]], **cut)["input_ids"]
                return [[Prompted(i, scoring.prompt_tokens) for i in ids] if scoring.prompt_tokens else ids]

            return render_texts

        def render(batch):
            names = ["query" if is_query else "document" for is_query in batch["query"]]
            texts = [scoring.prompts.get(n, "") + t for n, t in zip(names, batch["text"], strict=True)]
            ids = tokenizer(texts, **cut)["input_ids"]
            if scoring.prompt_tokens:
                ids = [Prompted(i, scoring.prompt_tokens.get(n, 0)) for i, n in zip(ids, names, strict=True)]
            return [ids]

        return render

    def evaluation(self, options, model, table, scoring, scores) -> Evaluation:
        """NDCG@10, MRR@10 and recall@1/10/20/100 of ranking every document for each query by cosine, beside BM25's
        ranking and the untrained start's (where there is one), and the lift over each."""
        from ..evaluators import RankingEvaluator
        from .plots import plot_training

        is_query = torch.tensor(table["query"])
        texts = table["text"]
        queries = [t for t, q in zip(texts, table["query"], strict=True) if q]
        documents = [t for t, q in zip(texts, table["query"], strict=True) if not q]
        relevance = torch.zeros(len(queries), len(documents), dtype=torch.float64)
        for row, relevant in enumerate(r for r, q in zip(table["relevant"], table["query"], strict=True) if q):
            relevance[row, relevant] = 1.0
        evaluator = RankingEvaluator(CUTOFFS)

        def report_of(similarity):
            return evaluator(similarity.flatten(), relevance.flatten(), [len(documents)] * len(queries))

        ours = report_of(cosines(scores[:, 0], is_query))
        report = {"task": self.name, "documents": len(documents), **ours}
        report["bm25"] = summary(report_of(bm25_similarity(queries, documents)))
        if scoring.base_model is not None:
            start = untrained_vectors(scoring, model, table)
            report["untrained"] = {"model": scoring.base_model, **summary(report_of(cosines(start, is_query)))}
        for baseline in ("bm25", "untrained"):
            if baseline in report:
                report.setdefault("lift", {})[baseline] = {k: ours[k] - report[baseline][k] for k in METRIC_KEYS}
        return Evaluation(report, partial(plot_training, report), report_text, "nothing")

    def check_evaluate(self, options, config) -> None:
        if options.calibrate:
            raise CliError("--calibrate fits a classifier's temperature; an embedder has none to fit")

    def prediction_columns(self, scoring, config, options) -> list[str]:
        return [scoring.key, "embedding"]

    def prediction_rows(self, batch, scores, scoring, config, options) -> list[dict]:
        rows = copied_rows(batch, [scoring.key])
        for row, vector in zip(rows, scores[:, 0].tolist(), strict=True):
            row["embedding"] = vector
        return rows


METRIC_KEYS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@20", "recall@100", "map")


def summary(report) -> dict:
    return {k: report[k] for k in METRIC_KEYS}


def cosines(vectors, is_query):
    """Query x document similarities of the (normalised) vectors."""
    vectors = vectors.double()
    return vectors[is_query] @ vectors[~is_query].T


def bm25_similarity(queries, documents):
    """BM25's scores of every document for each query (0 where it shares no term)."""
    found, scores = bm25_hits(queries, documents, len(documents))
    similarity = torch.zeros(len(queries), len(documents), dtype=torch.float64)
    similarity.scatter_(1, torch.as_tensor(found, dtype=torch.long), torch.as_tensor(scores, dtype=torch.float64))
    return similarity


def untrained_start(folder) -> str | None:
    """The base model the folder's card names, where it is a local folder (else no untrained column)."""
    from pathlib import Path

    from huggingface_hub import metadata_load

    card = Path(folder) / "README.md"
    base = (metadata_load(card) or {}).get("base_model") if card.is_file() else None
    return base if base and (Path(base) / "config.json").is_file() else None


def untrained_vectors(scoring: Retrieval, model, table):
    """The untrained start's vectors of the same texts, tokenized as the trained model's (same prompts, pooling and
    tokenizer; a pad row it added gets the mean embedding), on rank 0."""
    from ..model_kinds import EMBEDDER_KIND
    from ..tokenization import setup_pad_token
    from .engines import torch_engine

    config = model.config
    start = EMBEDDER_KIND.load(
        scoring.base_model,
        pooling=config.classifier_pooling,
        normalize=config.embedding_normalize,
        include_prompt=getattr(config, "embedding_include_prompt", True),
        dtype=torch.float32,
    ).eval()
    with warnings.catch_warnings():  # its config's pad id follows the trained tokenizer's: a copy in memory, unsaved
        warnings.filterwarnings("ignore", message="setup_pad_token", category=UserWarning)
        setup_pad_token(scoring.tokenizer, start)
    start.to(next(model.parameters()).device)
    render = TASK.render(scoring, scoring.tokenizer, None, None)
    ids = render(table.to_dict())[0]
    return torch_engine(EMBEDDER_KIND, start, scoring.tokenizer, 16)(ids)


def report_text(report) -> str:
    lines = [f"retrieval, {report['queries']} queries over {report['documents']} documents"]
    columns = [("embedder", report)] + [(name, report[name]) for name in ("bm25", "untrained") if name in report]
    lines.append(f"  {'':10}" + "".join(f" {name:>10}" for name, _ in columns))
    for key in METRIC_KEYS:
        lines.append(f"  {key:10}" + "".join(f" {values[key]:10.4f}" for _, values in columns))
    if "untrained" in report:
        lines.append(f"  (untrained: {report['untrained']['model']})")
    return "\n".join(lines)


TASK = Embedding()
