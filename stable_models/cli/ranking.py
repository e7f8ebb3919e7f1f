"""Ranking: rerankers trained on query groups (a query, one or more relevant documents, hard negatives) with a
listwise loss (or pointwise, RankNet, distillation from teacher scores), packed padding-free with every group whole
in one micro-batch; evaluated by NDCG, MRR, MAP and Recall over queries beside the first stage's order; a score and a
rank per document out. A reranker is a Stable classifier with one output labelled "score"; its config keeps the
template its inputs were rendered with, so evaluate, predict and vLLM read the same tokens."""

import json
import random
import sys
from dataclasses import dataclass
from functools import partial
from itertools import groupby

import torch

from ..evaluators import RankingEvaluator
from ..modeling_files import RERANKER, model_kind
from .data import check_texts, column_max, require_column
from .errors import CliError
from .ranking_data import (
    RankingLayout,
    explode,
    mined_groups,
    ranking_layout,
    read_groups,
    template_ids,
    template_of,
    tokenized_groups,
)
from .task_steps import (
    Evaluation,
    ModelInputs,
    Options,
    Task,
    TrainingData,
    copied_rows,
    held_out,
    keep_trained_length,
    positions,
    read_in,
)

SCORE = "score"  # the one label of a reranker (config.id2label)
METRIC_KEYS = ("ndcg@1", "ndcg@5", "ndcg@10", "mrr@10", "map", "recall@1", "recall@5", "recall@10")


@dataclass(frozen=True)
class QueryDocuments:
    """What evaluate and predict score for a reranker: (query, document) inputs rendered with the template the model
    was trained with, cut to `limit` tokens."""

    layout: RankingLayout
    template: str  # config.reranker_template
    instruction: str | None  # config.reranker_instruction
    limit: int  # the trained length, and never more than the model's positions
    pointwise_rows: bool  # predict on pointwise rows: scored as they are, ranked within --group-key (or query)
    group_key: str | None
    need_positive: bool  # evaluate: every group has a relevant document

    @classmethod
    def of(cls, layout, config, tokenizer, pointwise_rows: bool, group_key=None, need_positive=False):
        limit = min(tokenizer.model_max_length, positions(config))
        instruction = getattr(config, "reranker_instruction", None)
        return cls(layout, config.reranker_template, instruction, limit, pointwise_rows, group_key, need_positive)


@dataclass(frozen=True)
class RankingOptions(Options):
    label_key: str | None = read_in("train", "evaluate")
    group_key: str | None = read_in("train", "evaluate", "predict")
    loss: str | None = read_in("train")
    temperature: float | None = read_in("train")
    negatives: int | None = read_in("train")
    template: str | None = read_in("train")
    instruction: str | None = read_in("train")
    mine_negatives: int | None = read_in("train")
    corpus: str | None = read_in("train")
    init_from_tokens: list | None = read_in("train")
    save_generative: bool = read_in("train", default=False)
    top_k: int | None = read_in("predict")


class Ranking(Task):
    name = "ranking"
    kind = "rerankers"
    noun = "query groups"
    Options = RankingOptions
    summary_keys = ("ndcg@10", "mrr@10", "map", "loss")

    def claims(self, table) -> bool:
        layout = ranking_layout(table)
        return layout is not None and layout.kind != "pointwise"

    def owns_model(self, config) -> bool:
        return model_kind(config) == RERANKER

    # --- train
    def read(self, options, table, say) -> TrainingData:
        layout = require_layout(table, options, options.train)
        groups = read_groups(table, layout, options, options.train)
        groups = mined_groups(groups, options, say)

        def read_eval(eval_table):
            return read_groups(
                eval_table, require_layout(eval_table, options, options.eval), options, options.eval
            ), None

        groups, eval_groups, _ = held_out(options, groups, read_eval)
        return TrainingData(self, groups, eval_groups, "regression", [SCORE], options, layout)

    def model_options(self, options, data) -> dict:
        trained_template(options)  # a bad --template stops before the model loads
        if options.save_generative and (not options.init_from_tokens or options.pooling != "last"):
            raise CliError(
                "--save-generative needs --init-from-tokens YES NO and last-token pooling: the score is "
                "the log-odds of YES over NO at the last position"
            )
        return super().model_options(options, data)

    def describe_model(self, data) -> str:
        return "reranker"

    def prepare(self, options, data, tokenizer, say) -> None:
        template = trained_template(options)
        loss = loss_kind(options, data)
        say(
            f"[train] query groups ({data.details.describe()}), {loss} loss: {template.describe()}",
            file=sys.stderr,
        )

    def prepare_model(self, options, data, model, tokenizer, say) -> None:
        """--init-from-tokens YES NO: the score head becomes W_lm[YES] - W_lm[NO], so the untrained reranker gives
        the causal LM's own log-odds of YES over NO at the last position (ms-swift's generative reranker, vLLM's
        from_2_way_softmax). The config keeps the template, and the tokenizer carries it as a chat template, so
        evaluate, predict, sentence-transformers and vLLM render as training did."""
        from ..consumers import COLUMNS, consumer_table
        from ..templates import attach_template

        attach_template(model, tokenizer, trained_template(options))
        for cell in consumer_table(model.config, tokenizer):  # the stock class's pad == eos is the README's story
            if cell.ok is False and cell.consumer != COLUMNS[2]:
                say(
                    f"[train] warning: {cell.consumer} will not score this reranker as trained: {cell.how}",
                    file=sys.stderr,
                )
        if options.init_from_tokens:
            yes, no = options.init_from_tokens
            lm = causal_lm(options.model, options.gguf_file)  # loaded once: the score's init and the generative head
            init_score_from_tokens(model, lm, tokenizer, yes, no)
            if options.save_generative:
                data.prepared["lm_head"] = untied_head(lm)
            del lm
            say(f"[train] score head = W_lm[{yes!r}] - W_lm[{no!r}] (the LM's log-odds)", file=sys.stderr)
        if not options.no_packing:
            from ..modeling_rules import shared_prefix_obstacle

            why = shared_prefix_obstacle(model)
            said = "computed once per group" if why is None else f"computed per document: {why}"
            say(f"[train] the tokens a group's documents start with (template head, query): {said}", file=sys.stderr)

    def save_more(self, options, data, model, tokenizer, output, say) -> None:
        """--save-generative: OUTPUT/generative, the reranker as a plain causal LM (stable_models.generative)."""
        if not options.save_generative:
            return
        from ..generative import save_generative

        yes, no = options.init_from_tokens
        how = save_generative(model, tokenizer, output / "generative", yes, no, data.prepared.get("lm_head"))
        say(
            f"[train] generative form: {output / 'generative'} (a causal LM: {how['score']}; vLLM: hf_overrides="
            f"{json.dumps(how['vllm_hf_overrides'])}; sentence-transformers: CrossEncoder(folder))",
            file=sys.stderr,
        )
        if how["bias_not_carried"]:
            say(
                f"[train] the generative form has no bias: its scores are {how['bias_not_carried']:+.4g} off "
                "(the order is the same)",
                file=sys.stderr,
            )

    def tokenize(self, options, tokenizer, limit, data, say) -> tuple:
        template = trained_template(options)
        sets = [tokenized_groups(groups, tokenizer, template, limit) for groups in (data.train, data.eval)]
        keep_trained_length(tokenizer, max(column_max(s, "longest") for s in sets))
        return tuple(sets)

    def longest(self, train_set, tokenizer) -> int:
        return column_max(train_set, "longest")

    def collator(self, tokenizer, packing: bool, model):
        """Packed groups compute the tokens their documents share (template head, query) once, where the model takes
        such rows (full attention, last-token pooling, an eager or sdpa kernel); padded groups for recurrent models and
        --no-packing."""
        from ..modeling_rules import shared_prefix_obstacle
        from ..packing import PackedGroupCollator, PaddedGroupCollator

        if not packing:
            return ModelInputs(PaddedGroupCollator(tokenizer), (*self.token_columns, "relevance", "teacher"))
        share = shared_prefix_obstacle(model.get_base_model() if hasattr(model, "get_base_model") else model) is None
        inner = PackedGroupCollator(pad_token_id=tokenizer.pad_token_id, share_prefixes=share)
        return ModelInputs(inner, (*self.token_columns, "relevance", "teacher"))

    def training_set(self, options, train_set):
        """--negatives N: each time a group is drawn (every epoch), N of its negatives, sampled anew."""
        if not options.negatives:
            return train_set
        return train_set.with_transform(
            partial(sample_negatives, count=options.negatives, rng=random.Random(options.seed))
        )

    def trainer_class(self):
        from ..trainers import RankingTrainer

        return RankingTrainer

    def trainer_options(self, options, data, eval_set) -> dict:
        widest = max((len(ids) for ids in eval_set["relevance"]), default=1)
        from ..losses import ranking_loss_named

        loss = ranking_loss_named(loss_kind(options, data), options.temperature or 1.0)
        return {"loss": loss, "group_width": widest}

    def compute_metrics(self, data):
        return RankingEvaluator().compute_metrics

    def best_metric(self, data):
        return "ndcg@10", True

    def preflight_examples(self, data, train_set) -> tuple:
        """The first groups' documents (at most 32) and their relevances (a regression loss: the check is of the
        model's numerics, not of the ranking loss)."""
        first = train_set[: min(8, len(train_set))]
        ids = [i for group in first["input_ids"] for i in group][:32]
        labels = [float(r) for group in first["relevance"] for r in group][:32]
        return ids, labels, torch.float32

    # --- evaluate and predict
    def evaluation_input(self, options, table, config, tokenizer, say) -> QueryDocuments:
        layout = require_layout(table, options, options.data)  # the groups are read and checked once: scored_table
        return QueryDocuments.of(layout, config, tokenizer, pointwise_rows=False, need_positive=True)

    def prediction_input(self, options, table, config, tokenizer, say) -> QueryDocuments:
        layout = require_layout(table, options, options.data)
        if layout.kind != "pointwise":  # the groups are read and checked once: scored_table
            return QueryDocuments.of(layout, config, tokenizer, pointwise_rows=False)
        check_texts(table, options.data, "query", "document")
        if options.group_key:
            require_column(table, options.group_key, options.data, "--group-key")
        return QueryDocuments.of(layout, config, tokenizer, pointwise_rows=True, group_key=options.group_key)

    def scored_table(self, options, table, scoring: QueryDocuments):
        if scoring.pointwise_rows:
            return table
        groups = read_groups(table, scoring.layout, options, options.data, need_positive=scoring.need_positive)
        return explode(groups)  # before the weights load: a bad group stops the command first

    def scored_columns(self, scoring: QueryDocuments, options) -> list[str]:
        if scoring.pointwise_rows:
            group = [scoring.group_key] if scoring.group_key else []
            return list(dict.fromkeys(["query", "document"] + group))
        return ["group", "query", "document", "relevance", "position", "prompt"]

    def render(self, scoring: QueryDocuments, tokenizer, options, cuts):
        template = template_of(scoring.template, scoring.instruction)

        def render(batch):
            prompts = batch.get("prompt")
            ids, cut_from = template_ids(template, tokenizer, batch["query"], batch["document"], scoring.limit, prompts)
            cuts.add(cut_from, scoring.limit)
            return [ids]

        return render

    def evaluation(self, options, model, table, scoring: QueryDocuments, scores) -> Evaluation:
        """NDCG@1/5/10, MRR@10, MAP, Recall@1/5/10 over queries, the same for the input's own order (the first stage)
        and the lift; --calibrate fits a temperature to sigmoid(score) as the probability of relevance."""
        from ..calibration import calibrate_pairwise
        from .plots import plot_ranking

        scores = scores[:, 0, 0].double()
        groups = table["group"]
        sizes = [len(list(run)) for _, run in groupby(groups)]  # exploded groups are contiguous
        relevance = torch.tensor(table["relevance"], dtype=torch.float64)
        evaluator = RankingEvaluator()
        ours = evaluator(scores, relevance, sizes)
        first_stage = evaluator(-torch.tensor(table["position"], dtype=torch.float64), relevance, sizes)
        report = {
            "task": self.name,
            **{k: ours[k] for k in (*METRIC_KEYS, "queries")},
            "documents": len(scores),
            "first_stage": {k: first_stage[k] for k in METRIC_KEYS},
            "lift": {k: ours[k] - first_stage[k] for k in METRIC_KEYS},
            "per_query_ndcg@10": ours["per_query_ndcg@10"],
        }
        if options.calibrate:
            targets = (relevance > 0).long().tolist()
            report["calibration"], _, _ = calibrate_pairwise(model, scores, torch.zeros_like(scores), targets)
        draw = partial(plot_ranking, report, first_stage["per_query_ndcg@10"])
        return Evaluation(report, draw, report_text, "relevance temperature")

    def prediction_columns(self, scoring: QueryDocuments, config, options) -> list[str]:
        if scoring.pointwise_rows:
            key = [scoring.group_key] if scoring.group_key not in (None, "query", "document") else []
            return ["query", *key, "document", "score", "rank"]
        return ["group", "query", "document", "score", "rank"]

    def prediction_rows(self, batch, scores, scoring: QueryDocuments, config, options) -> list[dict]:
        rows = copied_rows(batch, self.prediction_columns(scoring, config, options))
        for i, (row, value) in enumerate(zip(rows, scores[:, 0, 0].tolist(), strict=True)):
            if not scoring.pointwise_rows:
                row["group"] = batch["group"][i] + 1  # the group's number in the input (1 = first)
            row["score"] = value
        return rows

    def ranked_by(self, scoring: QueryDocuments, options):
        return ((scoring.group_key or "query") if scoring.pointwise_rows else "group", "score")


def require_layout(table, options, path):
    layout = ranking_layout(table)
    if layout is None:
        raise CliError(
            f"{path}: not reranking data (columns: {', '.join(table.column_names)}); use query / pos / neg "
            "(FlagEmbedding), query / positive / negative_1..n (sentence-transformers), messages / positive_messages / "
            "negative_messages (ms-swift) or query / document / label rows"
        )
    return layout


def trained_template(options):
    return template_of(options.template or "pair", options.instruction)


def loss_kind(options, data) -> str:
    """--loss, or by default distillation where the file has teacher scores and listwise otherwise."""
    if options.loss:
        if options.loss == "distillation" and not data.details.teacher:
            raise CliError("--loss distillation needs teacher scores (pos_scores / neg_scores columns)")
        return options.loss
    return "distillation" if data.details.teacher else "listwise"


def sample_negatives(batch, count: int, rng):
    """A with_transform over tokenized groups: every positive, and `count` negatives drawn anew at each access."""
    out = {key: [] for key in batch}
    for i in range(len(batch["relevance"])):
        relevance = batch["relevance"][i]
        positives = [j for j, r in enumerate(relevance) if r > 0]
        negatives = [j for j, r in enumerate(relevance) if r <= 0]
        kept = sorted(positives + rng.sample(negatives, min(count, len(negatives))))
        for key in batch:
            value = batch[key][i]
            out[key].append([value[j] for j in kept] if key in ("input_ids", "relevance", "teacher") else value)
    return out


def causal_lm(folder, gguf_file=None):
    from transformers import AutoModelForCausalLM

    where = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **where)
    except (OSError, ValueError) as error:
        raise CliError(f"--init-from-tokens: {folder} has no causal LM head ({str(error).splitlines()[0]})") from None


def untied_head(lm):
    """The base causal LM's output embeddings where it does not tie them to its input embeddings, else None."""
    head, embeddings = lm.get_output_embeddings().weight, lm.get_input_embeddings().weight
    return None if head.data_ptr() == embeddings.data_ptr() else head.detach().float().clone()


def init_score_from_tokens(model, lm, tokenizer, yes: str, no: str) -> None:
    """score.weight = W_lm[yes] - W_lm[no] (bias 0), from the causal LM's output embeddings (tied or not)."""
    from ..generative import token_id

    try:
        ids = [token_id(tokenizer, token) for token in (yes, no)]
    except ValueError as error:
        raise CliError(f"--init-from-tokens: {error}") from None
    head = lm.get_output_embeddings().weight.detach().float()
    with torch.no_grad():
        model.score.weight.copy_((head[ids[0]] - head[ids[1]]).reshape(model.score.weight.shape))
        if model.score.bias is not None:
            model.score.bias.zero_()


def report_text(report) -> str:
    lines = [f"reranking, {report['queries']} queries, {report['documents']} documents"]
    lines.append(f"  {'':10} {'reranker':>9} {'first stage':>12} {'lift':>8}")
    for key in METRIC_KEYS:
        lines.append(f"  {key:10} {report[key]:9.4f} {report['first_stage'][key]:12.4f} {report['lift'][key]:+8.4f}")
    return "\n".join(lines)


TASK = Ranking()
