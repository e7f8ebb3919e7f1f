"""The embedding task (issue 58): an embedding model trained contrastively on queries, positives and hard negatives,
InfoNCE over the whole global batch (`stable_models.embedding_training`), its prompts saved with it; evaluated by
retrieval over the file's documents; `predict` writes an `embedding` per row.

Never chosen by `--task auto`: its files are the reranker's layouts (and sentence-transformers' anchor / positive),
so `--task embedding` names it.
"""

import sys
from dataclasses import dataclass
from functools import partial

import torch

from ..model_kinds import EMBEDDER_KIND
from ..modeling_files import EMBEDDER, model_kind
from .data import check_texts, column_max
from .embedding_data import read_groups_checked, tokenized, training_rows
from .errors import CliError
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

CUTOFFS = (1, 10, 100)  # recall@100 for a first stage's depth; NDCG@10 and MRR@10 its quality


@dataclass(frozen=True)
class EmbeddingOptions(Options):
    query_prompt: str | None = read_in("train")
    document_prompt: str | None = read_in("train")
    temperature: float | None = read_in("train")
    text_key: str | None = read_in("predict")
    prompt_name: str | None = read_in("predict")


@dataclass(frozen=True)
class EmbedTexts:
    """What predict embeds: a text per row, after the saved prompt `--prompt-name` names."""

    key: str
    prompt: str
    limit: int


@dataclass(frozen=True)
class Retrieval:
    """What evaluate embeds: each group's query (after the query prompt) and every distinct document of the file."""

    prompts: dict
    limit: int


def prompts_of(options) -> dict:
    return {"query": options.query_prompt or "", "document": options.document_prompt or ""}


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
        groups, eval_groups, _ = held_out(
            options, groups, lambda t: (read_groups_checked(t, options, options.eval)[0], None)
        )
        rows = training_rows(groups), training_rows(eval_groups)
        return TrainingData(self, *rows, "embedding", ["vector"], options, layout)

    def model_options(self, options, data) -> dict:
        return {"prompts": prompts_of(options)}

    def describe_model(self, data) -> str:
        return "contrastive embedding"

    def prepare(self, options, data, tokenizer, say) -> None:
        """The saved tokenizer ends every text with eos where the vector is the last token's; a prompt that fills
        --max-length alone is refused."""
        from ..tokenization import append_eos

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
        from ..embedding_training import EmbeddingCollator

        return EmbeddingCollator(tokenizer)

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
        return Retrieval(dict(getattr(config, "embedding_prompts", None) or {}), limit)

    def prediction_input(self, options, table, config, tokenizer, say) -> EmbedTexts:
        key = options.text_key or "text"
        check_texts(table, options.data, key, None)
        prompts = getattr(config, "embedding_prompts", None) or {}
        prompt = prompts.get(options.prompt_name, "") if options.prompt_name else ""
        return EmbedTexts(key, prompt, min(tokenizer.model_max_length, positions(config)))

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
        cut = {"truncation": True, "max_length": scoring.limit}
        if isinstance(scoring, EmbedTexts):
            return lambda batch: [tokenizer([scoring.prompt + str(t) for t in batch[scoring.key]], **cut)["input_ids"]]

        def render(batch):
            prompts = scoring.prompts
            texts = [
                prompts.get("query" if is_query else "document", "") + text
                for text, is_query in zip(batch["text"], batch["query"], strict=True)
            ]
            return [tokenizer(texts, **cut)["input_ids"]]

        return render

    def evaluation(self, options, model, table, scoring, scores) -> Evaluation:
        """NDCG@10, MRR@10 and recall@1/10/100 of ranking every document of the file for each query by cosine."""
        from ..evaluators import RankingEvaluator
        from .plots import plot_training

        vectors = scores[:, 0].double()
        is_query = torch.tensor(table["query"])
        queries, documents = vectors[is_query], vectors[~is_query]
        similarity = queries @ documents.T
        relevance = torch.zeros_like(similarity)
        for row, relevant in enumerate(r for r, q in zip(table["relevant"], table["query"], strict=True) if q):
            relevance[row, relevant] = 1.0
        report = RankingEvaluator(CUTOFFS)(similarity.flatten(), relevance.flatten(), [len(documents)] * len(queries))
        report = {"task": self.name, "documents": len(documents), **report}
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


def report_text(report) -> str:
    lines = [f"retrieval, {report['queries']} queries over {report['documents']} documents (cosine)"]
    for key in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map"):
        lines.append(f"  {key:10} {report[key]:.4f}")
    return "\n".join(lines)


TASK = Embedding()
