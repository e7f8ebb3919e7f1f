"""`stable-models train / evaluate / predict` for rerankers: the four layouts read into the same query groups, bad
groups refused with one line, a trained reranker saved as one, NDCG / MRR beside the first stage, scores that do not
depend on the other documents, a loss that is the same packed, padded and accumulated, and --init-from-tokens giving
the causal LM's own log-odds."""

import json

import pytest
import torch
from test_doctor import save_checkpoint
from tiny_tokenizers import qwen2_like
from transformers import AutoModelForCausalLM, AutoTokenizer

import stable_models
from stable_models import cli
from stable_models.cli.data import read_table
from stable_models.cli.ranking_data import ranking_layout, read_groups, template_ids
from stable_models.templates import QWEN3, RerankTemplate

datasets = pytest.importorskip("datasets")

TOPICS = ["great", "awful", "dull", "loved", "plot", "actor"]
FAST = ["--max-steps", "4", "--eval-steps", "2", "--batch-size", "2", "--lr", "5e-3", "--early-stopping", "0"]


def groups(count=12):
    """(query, positives, negatives): the relevant documents name the query's topic."""
    out = []
    for i in range(count):
        topic, other = TOPICS[i % len(TOPICS)], TOPICS[(i + 1 + i % 3) % len(TOPICS)]
        positives = [f"the film was {topic}"] + ([f"{topic} {topic} film"] if i % 2 else [])
        negatives = [f"the film was {other}", f"a {TOPICS[(i + 4) % 6]} plot", "bad"][: 2 + i % 2]
        out.append((f"is it {topic} {i}", positives, negatives))
    return out


def layout_rows(layout, data):
    rows = []
    for query, positives, negatives in data:
        if layout == "flag":
            rows.append({"query": query, "pos": positives, "neg": negatives})
        elif layout == "tuples":  # one positive per row: a group per positive
            for positive in positives:
                rows.append(
                    {"query": query, "positive": positive, **{f"negative_{k + 1}": n for k, n in enumerate(negatives)}}
                )
        elif layout == "messages":
            rows.append(
                {
                    "messages": [{"role": "user", "content": query}],
                    "positive_messages": [[{"role": "assistant", "content": p}] for p in positives],
                    "negative_messages": [[{"role": "assistant", "content": n}] for n in negatives],
                }
            )
        else:
            rows += [{"query": query, "document": p, "label": 1} for p in positives]
            rows += [{"query": query, "document": n, "label": 0} for n in negatives]
    return rows


def write(path, table):
    path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


def run(*args):
    return cli.main([str(a) for a in args])


class Args:
    group_key, label_key, text_pair_key = None, "label", None


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Full attention on every layer, as rerankers users start from (Qwen3-Reranker): packed groups share a prefix."""
    return save_checkpoint(tmp_path_factory.mktemp("base"), "qwen2", qwen2_like(), use_sliding_window=False)


@pytest.fixture(scope="module")
def reranker(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rerank")
    data = write(folder / "train.jsonl", layout_rows("flag", groups()))
    output = folder / "model"
    assert run("train", "--model", base, "--train", data, "--output", output, "--eval-fraction", "0.25", *FAST) == 0
    return output, data


@pytest.mark.parametrize("layout", ["flag", "messages", "pointwise"])
def test_every_layout_reads_into_the_same_query_groups(layout, tmp_path):
    path = write(tmp_path / "data.jsonl", layout_rows(layout, groups()))
    table = read_table(path)
    found = ranking_layout(table)
    assert found.kind == layout
    read = read_groups(table, found, Args(), path)
    expected = [(q, p + n, [1.0] * len(p) + [0.0] * len(n)) for q, p, n in groups()]
    assert [(g["query"], g["documents"], g["relevance"]) for g in read] == expected


def test_sentence_transformers_tuples_make_a_group_per_positive(tmp_path):
    path = write(tmp_path / "data.jsonl", layout_rows("tuples", groups(4)))
    table = read_table(path)
    read = read_groups(table, ranking_layout(table), Args(), path)
    assert len(read) == sum(len(p) for _, p, _ in groups(4))
    assert all(g["relevance"][0] == 1.0 and set(g["relevance"][1:]) == {0.0} for g in read)


@pytest.mark.parametrize(
    "case, message",
    [
        ("no positive", r"no positive document in 1 row\(s\), first at row 3"),
        ("empty document", r"a document missing or empty in 1 row\(s\), first at row 3"),
        ("nan relevance", r"relevance 'label' is missing or NaN in 1 row\(s\), first at row 5"),
    ],
)
def test_bad_groups_are_one_line_and_nothing_is_written(case, message, base, tmp_path, capsys):
    rows = layout_rows("pointwise" if case == "nan relevance" else "flag", groups(6))
    if case == "no positive":
        rows[2]["pos"] = []
    elif case == "empty document":
        rows[2]["neg"][1] = "  "
    else:
        rows[4]["label"] = float("nan")
    data = tmp_path / "bad.jsonl"
    data.write_text("".join(json.dumps(r).replace("NaN", "NaN") + "\n" for r in rows))
    extra = ["--task", "ranking"] if case == "nan relevance" else []
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "out", *extra, *FAST) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and __import__("re").search(message, err[0]), err
    assert not (tmp_path / "out").exists()


def test_a_trained_reranker_is_saved_evaluated_and_ranks(reranker, tmp_path, capsys):
    output, data = reranker
    config = json.loads((output / "config.json").read_text())
    assert config["id2label"] == {"0": "score"} and config["reranker_template"] == "pair"
    assert "reranker" in (output / "README.md").read_text()
    test = write(tmp_path / "test.jsonl", layout_rows("flag", groups(18)[12:]))
    assert run("evaluate", "--model", output, "--data", test, "--report-dir", tmp_path / "report") == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["queries"] == 6 and report["documents"] == sum(len(p) + len(n) for _, p, n in groups(18)[12:])
    for key in ("ndcg@1", "ndcg@5", "ndcg@10", "mrr@10", "map", "recall@5"):
        assert 0 <= report[key] <= 1 and report["lift"][key] == pytest.approx(report[key] - report["first_stage"][key])
    assert report["first_stage"]["mrr@10"] == 1.0  # the file lists the positives first
    assert (tmp_path / "report" / "ndcg_per_query.png").is_file()
    out = tmp_path / "ranked.jsonl"
    assert run("predict", "--model", output, "--data", test, "--output", out, "--top-k", "2") == 0
    ranked = [json.loads(line) for line in out.read_text().splitlines()]
    by_group = {}
    for row in ranked:
        by_group.setdefault(row["group"], []).append(row)
    assert sorted(by_group) == list(range(1, 7)) and all(len(rows) == 2 for rows in by_group.values())
    for rows in by_group.values():
        assert sorted(r["rank"] for r in rows) == [1, 2]
        best = min(rows, key=lambda r: r["rank"])
        assert best["score"] == max(r["score"] for r in rows)


def test_a_score_does_not_depend_on_the_other_documents(reranker, tmp_path):
    """predict's scores equal the model's forward on each (query, document) alone (fp32, 1e-5)."""
    output, _ = reranker
    rows = layout_rows("pointwise", groups(3))
    for row in rows:
        row.pop("label")
    data = write(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "scores.jsonl"
    assert run("predict", "--model", output, "--data", data, "--output", out) == 0
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["query"], r["document"]) for r in scored] == [(r["query"], r["document"]) for r in rows]
    model = stable_models.from_pretrained(output).eval()
    tokenizer = AutoTokenizer.from_pretrained(output)
    with torch.no_grad():
        alone = [model(**tokenizer(r["query"], r["document"], return_tensors="pt")).logits.item() for r in rows]
    assert max(abs(a - r["score"]) for a, r in zip(alone, scored, strict=True)) <= 1e-5
    for query in {r["query"] for r in rows}:
        mine = sorted((r for r in scored if r["query"] == query), key=lambda r: r["rank"])
        assert [r["score"] for r in mine] == sorted((r["score"] for r in mine), reverse=True)


def training_losses(folder):
    return [e["loss"] for e in json.loads((folder / "training_log.json").read_text()) if "loss" in e]


def test_the_loss_is_the_same_packed_padded_and_accumulated(base, tmp_path, capsys):
    """Groups of 3 to 5 documents: batch 4 packed (each group's prefix computed once), batch 4 padded, and batch 2 x 2
    accumulated steps give the same loss history (the loss divides by the groups of the whole batch)."""
    data = write(tmp_path / "train.jsonl", layout_rows("flag", groups(16)))
    eval_data = write(tmp_path / "eval.jsonl", layout_rows("flag", groups(18)[16:]))
    common = ["--model", base, "--train", data, "--eval", eval_data, "--max-steps", "3", "--lr", "5e-3"]
    common += ["--early-stopping", "0", "--eval-steps", "3", "--full", "--seed", "1", "--dtype", "fp32"]  # fp32: exact
    runs = {
        "packed": ["--batch-size", "4"],
        "padded": ["--batch-size", "4", "--no-packing"],
        "accumulated": ["--batch-size", "2", "--grad-accum", "2"],
    }
    histories = {}
    for name, extra in runs.items():
        assert run("train", *common, *extra, "--output", tmp_path / name) == 0
        histories[name] = training_losses(tmp_path / name)
        shared = "start with (template head, query): computed once per group" in capsys.readouterr().err
        assert shared == (name != "padded"), name
    assert len(histories["packed"]) == 3
    for name in ("padded", "accumulated"):
        assert histories[name] == pytest.approx(histories["packed"], rel=1e-5), name


def test_init_from_tokens_gives_the_lms_log_odds(base, tmp_path):
    """The untrained reranker's score is logit(YES) - logit(NO) of the causal LM at the last position."""
    from stable_models.cli.ranking import init_score_from_tokens

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = stable_models.from_pretrained(base, num_labels=1).eval()
    lm = AutoModelForCausalLM.from_pretrained(base).eval()
    init_score_from_tokens(model, lm, tokenizer, "great", "bad")
    yes, no = (
        tokenizer("great", add_special_tokens=False)["input_ids"][0],
        tokenizer("bad", add_special_tokens=False)["input_ids"][0],
    )
    batch = tokenizer(["is it great the film was great", "bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        scores = model(**batch).logits[:, 0]
        last = batch["attention_mask"].sum(-1) - 1
        logits = lm(**batch).logits[torch.arange(2), last]
    assert torch.allclose(scores, logits[:, yes] - logits[:, no], atol=1e-5)
    assert (scores - scores.mean()).abs().max() > 1e-3  # not a constant


def test_a_long_input_is_cut_in_the_document_only():
    """Rendered whole, then cut inside the document with the template's end kept: the ids sentence-transformers'
    suffix-restoring truncation gives from the folder's chat template."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    tokenizer = qwen2_like()
    tokenizer.model_max_length = 100  # as train saves it (its longest input): longer documents are measured, then cut
    template = RerankTemplate("qwen3", None)
    query, document = "is it great", " ".join(["the film was great"] * 40)
    with CaptureLogger(logging.get_logger("transformers.tokenization_utils_base")) as said:
        (full,), (full_cut_from,) = template_ids(template, tokenizer, [query], [document], 10**9)
        pair_tokenizer = qwen2_like()
        pair_tokenizer.model_max_length = 100
        template_ids(RerankTemplate("pair", None), pair_tokenizer, [query], [document], 12)
    assert "indexing errors" not in said.out  # the tokenizer's "longer than the maximum" warning: they are cut
    (cut,), (cut_from,) = template.ids(tokenizer, [query], [document], 300)
    assert full_cut_from == 0 and cut_from == len(full)  # what evaluate's and predict's warning counts
    text, _, _ = template.render(query, document)
    assert full == tokenizer(text, add_special_tokens=False)["input_ids"]  # one text, tokenized whole
    head, tail = QWEN3.split("{document}")
    head_ids = tokenizer(head.format(query=query, instruction=template.instruction), add_special_tokens=False)[
        "input_ids"
    ]
    tail_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
    assert len(cut) == 300 and cut[: len(head_ids)] == head_ids and cut[-len(tail_ids) :] == tail_ids
    assert cut[: 300 - len(tail_ids)] == full[: 300 - len(tail_ids)]  # the document's first tokens, as rendered
    with pytest.raises(ValueError, match="a query and the template take"):
        template.ids(tokenizer, [query], [document], len(head_ids) + len(tail_ids))
    (pair,), (pair_cut_from,) = RerankTemplate("pair", None).ids(tokenizer, [query], [document], 12)
    assert pair_cut_from == len(tokenizer(query, document)["input_ids"])
    assert len(pair) == 12 and pair[: len(tokenizer(query)["input_ids"])] == tokenizer(query)["input_ids"]


def test_the_readme_reranker_commands_run_as_written(base, tmp_path, monkeypatch):
    import shlex

    from documented import commands

    lines = commands("--top-k")
    assert [line.split()[1] for line in lines] == ["train", "evaluate", "predict"]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "groups.jsonl", layout_rows("flag", groups(12)))
    write(tmp_path / "test_groups.jsonl", layout_rows("tuples", groups(16)[12:]))
    candidates = [{"query": r["query"], "document": r["document"]} for r in layout_rows("pointwise", groups(2))]
    write(tmp_path / "candidates.jsonl", candidates)
    for line in lines:
        argv = shlex.split(line.replace("./SmolLM2-135M-Instruct", str(base)))[1:]
        assert cli.main(argv + (FAST if argv[0] == "train" else [])) == 0, line
    ranked = [json.loads(line) for line in open("ranked.jsonl")]
    assert {r["query"] for r in ranked} == {c["query"] for c in candidates}
    assert all(1 <= r["rank"] <= 3 for r in ranked) and len(ranked) == 6
    assert json.loads(open("reranker/evaluation/report.json").read())["queries"] == sum(
        len(p) for _, p, _ in groups(16)[12:]
    )


def test_the_folder_loads_as_a_cross_encoder_that_ranks_as_predict_does(reranker, tmp_path):
    """sentence-transformers' CrossEncoder on the saved folder (trust_remote_code=True): rank() gives predict's
    order, and its scores are sigmoid(predict's score)."""
    import sentence_transformers  # a test dependency

    output, _ = reranker
    query, positives, negatives = groups(14)[13]
    documents = positives + negatives
    data = write(tmp_path / "one.jsonl", [{"query": query, "document": d} for d in documents])
    assert run("predict", "--model", output, "--data", data, "--output", tmp_path / "p.jsonl") == 0
    ours = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    encoder = sentence_transformers.CrossEncoder(str(output), trust_remote_code=True, device="cpu")
    ranked = encoder.rank(query, documents)
    assert [documents[r["corpus_id"]] for r in ranked] == [r["document"] for r in sorted(ours, key=lambda r: r["rank"])]
    expected = torch.sigmoid(torch.tensor([r["score"] for r in ours]))
    got = torch.tensor([next(x["score"] for x in ranked if x["corpus_id"] == i) for i in range(len(documents))])
    assert (got - expected).abs().max() <= 1e-5


def test_mined_negatives_are_bm25_hits_that_are_not_positives(tmp_path):
    from stable_models.cli.ranking_data import mine_negatives

    data = [("is it great 0", ["the film was great"], []), ("a dull plot 1", ["the plot was dull"], ["bad"])]
    table = datasets.Dataset.from_dict(
        {
            "query": [q for q, _, _ in data],
            "documents": [p + n for _, p, n in data],
            "relevance": [[1.0] * len(p) + [0.0] * len(n) for _, p, n in data],
            "row": [1, 2],
            "prompt": [None, None],
        }
    )
    corpus = ["the film was great", "great acting great film", "a great plot", "dull dull dull", "the plot was dull"]
    corpus += ["unrelated words here", "bad"]
    write(tmp_path / "corpus.jsonl", [{"text": t} for t in corpus])
    said = []
    mined = mine_negatives(table, str(tmp_path / "corpus.jsonl"), 2, lambda *a, **k: said.append(a[0]))
    first, second = mined[0], mined[1]
    assert first["documents"][0] == "the film was great" and len(first["documents"]) == 3
    assert set(first["documents"][1:]) <= {"great acting great film", "a great plot"}
    assert first["relevance"] == [1.0, 0.0, 0.0]
    assert "the plot was dull" not in second["documents"][1:] and "dull dull dull" in second["documents"]
    assert "unrelated words here" not in first["documents"] + second["documents"]
    assert said and "mined" in said[0] and "2 hit(s) that were the group's own positive dropped" in said[0]


def test_teacher_scores_train_by_distillation_and_calibrate_fits_a_relevance_temperature(
    base, reranker, tmp_path, capsys
):
    """FlagEmbedding's pos_scores / neg_scores make the default loss a KL to the teacher; evaluate --calibrate folds a
    temperature for sigmoid(score) as the probability of relevance into the saved head."""
    rows = layout_rows("flag", groups(10))
    for i, row in enumerate(rows):
        row["pos_scores"] = [3.0 + i % 2] * len(row["pos"])
        row["neg_scores"] = [-1.0 - k for k in range(len(row["neg"]))]
    data = write(tmp_path / "teacher.jsonl", rows)
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "kd", *FAST) == 0
    assert "distillation loss" in capsys.readouterr().err
    rows[3]["neg_scores"] = rows[3]["neg_scores"][:-1]  # one teacher score short
    bad = write(tmp_path / "short.jsonl", rows)
    assert run("train", "--model", base, "--train", bad, "--output", tmp_path / "bad", *FAST) == 2
    assert "teacher scores missing, not finite or not one per document in 1 row(s), first at row 4" in (
        capsys.readouterr().err
    )
    import shutil

    output, _ = reranker
    copy = tmp_path / "calibrated"
    shutil.copytree(output, copy)
    test = write(tmp_path / "test.jsonl", layout_rows("flag", groups(18)[12:]))
    before = stable_models.from_pretrained(copy).score.weight.detach().clone()
    assert run("evaluate", "--model", copy, "--data", test, "--calibrate") == 0
    fitted = json.loads((copy / "evaluation" / "report.json").read_text())["calibration"]
    after = stable_models.from_pretrained(copy).score.weight.detach()
    assert fitted["nll_after"] <= fitted["nll_before"] + 1e-9
    assert torch.allclose(after, before / fitted["temperature"], atol=1e-6)


def test_save_generative_writes_a_causal_lm_whose_log_odds_are_predicts_scores(base, tmp_path, capsys):
    """--save-generative: OUTPUT/generative loads without remote code as a causal LM (transformers) and as a
    sentence-transformers CrossEncoder (LogitScore), each giving predict's scores; a qwen3-template reranker."""
    write(tmp_path / "groups.jsonl", layout_rows("flag", groups(12)))
    out = tmp_path / "reranker"
    argv = ["train", "--model", base, "--train", tmp_path / "groups.jsonl", "--output", out, *FAST, "--full"]
    argv += ["--template", "qwen3", "--instruction", "judge", "--init-from-tokens", "great", "bad", "--save-generative"]
    assert run(*argv) == 0
    assert "generative form:" in capsys.readouterr().err
    documents = ["the film was great", "bad", "a dull plot", "loved loved film"]
    write(tmp_path / "candidates.jsonl", [{"query": "is it great", "document": d} for d in documents])
    assert (
        run("predict", "--model", out, "--data", tmp_path / "candidates.jsonl", "--output", tmp_path / "p.jsonl") == 0
    )
    expected = torch.tensor([json.loads(line)["score"] for line in (tmp_path / "p.jsonl").read_text().splitlines()])
    folder = out / "generative"
    assert not list(folder.glob("*.py"))  # nothing to trust: no remote code
    how = json.loads((folder / "reranker.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not lm.config.tie_word_embeddings
    messages = [[{"role": "query", "content": "is it great"}, {"role": "document", "content": d}] for d in documents]
    with torch.no_grad():
        logits = [
            lm(**tokenizer.apply_chat_template(m, tokenize=True, return_dict=True, return_tensors="pt")).logits[0, -1]
            for m in messages
        ]
    log_odds = torch.stack([row[how["yes_token_id"]] - row[how["no_token_id"]] for row in logits])
    assert (log_odds - expected).abs().max() <= 1e-4
    from sentence_transformers import CrossEncoder

    encoder = CrossEncoder(str(folder))
    scores = torch.tensor(encoder.predict([("is it great", d) for d in documents], activation_fn=torch.nn.Identity()))
    assert (scores - expected).abs().max() <= 1e-4


def test_save_generative_needs_the_tokens_and_ranking(base, tmp_path, capsys):
    write(tmp_path / "groups.jsonl", layout_rows("flag", groups(12)))
    argv = ["train", "--model", base, "--train", tmp_path / "groups.jsonl", "--output", tmp_path / "o", *FAST]
    assert run(*argv, "--save-generative") == 2
    assert "--save-generative needs --init-from-tokens" in capsys.readouterr().err
    write(
        tmp_path / "labels.jsonl",
        [{"text": "the film was great", "label": "good"}, {"text": "bad", "label": "bad"}] * 4,
    )
    argv = ["train", "--model", base, "--train", tmp_path / "labels.jsonl", "--output", tmp_path / "c", *FAST]
    assert run(*argv, "--save-generative") == 2
    assert "--save-generative is read for rerankers in train, not for classifiers" in capsys.readouterr().err


def test_save_adapter_keeps_the_lora_unmerged_and_every_command_takes_the_folder(base, tmp_path, capsys):
    """--save-adapter: a peft adapter on the base (the LoRA, `score` in modules_to_save) plus the classifier's
    config; peft onto the Stable class gives predict's scores, which equal a merged run's; evaluate and verify read
    it; --calibrate and the vLLM engine refuse it with one line."""
    from peft import PeftModel

    write(tmp_path / "groups.jsonl", layout_rows("flag", groups(12)))
    common = ["train", "--model", base, "--train", tmp_path / "groups.jsonl", *FAST, "--template", "qwen3"]
    assert run(*common, "--output", tmp_path / "merged") == 0
    assert run(*common, "--output", tmp_path / "adapter", "--save-adapter") == 0
    folder = tmp_path / "adapter"
    settings = json.loads((folder / "adapter_config.json").read_text())
    assert settings["base_model_name_or_path"] == str(base) and "score" in settings["modules_to_save"]
    assert not (folder / "model.safetensors").exists() and not list(folder.glob("*.py"))
    documents = ["the film was great", "bad", "a dull plot"]
    write(tmp_path / "c.jsonl", [{"query": "is it great", "document": d} for d in documents])
    scores = {}
    for name in ("merged", "adapter"):
        assert (
            run(
                "predict",
                "--model",
                tmp_path / name,
                "--data",
                tmp_path / "c.jsonl",
                "--output",
                tmp_path / f"{name}.jsonl",
            )
            == 0
        )
        scores[name] = torch.tensor(
            [json.loads(x)["score"] for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        )
    assert (scores["adapter"] - scores["merged"]).abs().max() <= 1e-4
    model = stable_models.from_pretrained(folder, merge=False).eval()  # peft's model on the Stable class, unmerged
    assert isinstance(model, PeftModel)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [[{"role": "query", "content": "is it great"}, {"role": "document", "content": d}] for d in documents]
    with torch.no_grad():
        got = torch.cat(
            [
                model(**tokenizer.apply_chat_template(m, tokenize=True, return_dict=True, return_tensors="pt")).logits[
                    :, 0
                ]
                for m in messages
            ]
        )
    assert (got - scores["adapter"]).abs().max() <= 1e-4
    write(tmp_path / "test.jsonl", layout_rows("flag", groups(16)[12:]))
    assert run("evaluate", "--model", folder, "--data", tmp_path / "test.jsonl") == 0
    assert run("verify", folder) == 0
    assert "consumers" in capsys.readouterr().out
    assert run("evaluate", "--model", folder, "--data", tmp_path / "test.jsonl", "--calibrate") == 2
    assert "is an adapter: merge it first" in capsys.readouterr().err
    argv = ["predict", "--model", folder, "--data", tmp_path / "c.jsonl", "--output", tmp_path / "v.jsonl"]
    assert run(*argv, "--engine", "vllm") == 2
    assert "LoRA module on its base" in capsys.readouterr().err
