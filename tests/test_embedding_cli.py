"""`stable-models train / evaluate / predict --task embedding`: the layouts users have read into the same rows, bad
rows refused with one line before anything is written, a trained embedder whose `predict` vectors (after the saved
prompt) are the library's and sentence-transformers' without remote code, and retrieval metrics from `evaluate`."""

import json

import pytest
import torch
from test_doctor import save_checkpoint
from test_ranking_cli import FAST, groups, layout_rows, write
from tiny_tokenizers import qwen2_like

import stable_models
from stable_models import cli
from stable_models.cli.data import read_table
from stable_models.cli.embedding_data import read_groups_checked, training_rows

datasets = pytest.importorskip("datasets")
TEXTS = ["the film was great", "bad", "a dull plot"]


def run(*args):
    return cli.main([str(a) for a in args])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("base"), "qwen2", qwen2_like(), use_sliding_window=False)


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("embedder")
    data = write(folder / "groups.jsonl", layout_rows("flag", groups(16)))
    argv = ["train", "--task", "embedding", "--model", base, "--train", data, "--output", folder / "model", *FAST]
    assert run(*argv, "--query-prompt", "query: ", "--dtype", "fp32") == 0
    return folder / "model", data


class Options:
    group_key, label_key, text_pair_key = None, "label", None


def rows_of(path):
    groups_table, _ = read_groups_checked(read_table(path, None), Options(), path)
    return sorted((r["query"], r["positive"], tuple(r["negatives"])) for r in training_rows(groups_table))


def test_the_layouts_read_into_the_same_rows(tmp_path):
    flag = [{"query": "q1", "pos": ["a"], "neg": ["b", "c"]}, {"query": "q2", "pos": ["d"], "neg": ["e"]}]
    st = [
        {"anchor": "q1", "positive": "a", "negatives": ["b", "c"]},
        {"anchor": "q2", "positive": "d", "negatives": ["e"]},
    ]
    numbered = [
        {"anchor": "q1", "positive": "a", "negative_1": "b", "negative_2": "c"},
        {"anchor": "q2", "positive": "d", "negative_1": "e", "negative_2": None},
    ]
    expected = rows_of(write(tmp_path / "flag.jsonl", flag))
    assert expected == [("q1", "a", ("b", "c")), ("q2", "d", ("e",))]
    assert rows_of(write(tmp_path / "st.jsonl", st)) == expected
    assert rows_of(write(tmp_path / "numbered.jsonl", numbered)) == expected
    pairs = [{"anchor": "q1", "positive": "a"}, {"query": "q2", "positive": "d"}][:1]  # plain pairs: no negatives
    assert rows_of(write(tmp_path / "pairs.jsonl", pairs)) == [("q1", "a", ())]
    two = [{"query": "q1", "pos": ["a", "a2"], "neg": ["b"]}]  # a row per positive
    assert rows_of(write(tmp_path / "two.jsonl", two)) == [("q1", "a", ("b",)), ("q1", "a2", ("b",))]


BAD = {
    "an empty query": ([{"query": "", "pos": ["a"], "neg": ["b"]}], [], "query missing or empty"),
    "an empty positive": ([{"query": "q", "pos": [""], "neg": ["b"]}], [], "a document missing or empty"),
    "no positive": ([{"query": "q", "pos": [], "neg": ["b"]}], [], "no positive document"),
    "positive and negative": ([{"query": "q", "pos": ["a"], "neg": ["a"]}], [], "both positive and negative"),
    "a prompt that fills the length": (
        [{"query": "q", "pos": ["a"], "neg": ["b"]}],
        ["--query-prompt", "a very long prompt " * 4, "--max-length", "8"],
        "--query-prompt is",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(case, base, tmp_path, capsys):
    rows, extra, message = BAD[case]
    data = write(tmp_path / "bad.jsonl", rows * 4)
    argv = ["train", "--task", "embedding", "--model", base, "--train", data, "--output", tmp_path / "out", *FAST]
    assert run(*argv, *extra) == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1] and err.splitlines()[-1].startswith("stable-models: error: "), err
    if not extra:  # a bad row: refused before the model loads, so the error is all there is
        assert err.count("\n") == 1, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_mined_negatives_join_the_rows_and_a_hit_that_is_a_positive_is_dropped_and_counted(base, tmp_path, capsys):
    data = write(tmp_path / "g.jsonl", layout_rows("flag", groups(8)))
    corpus = write(tmp_path / "corpus.jsonl", [{"text": t} for t in ["the film was great", "a great film", "dull"]])
    argv = ["train", "--task", "embedding", "--model", base, "--train", data, "--output", tmp_path / "out", *FAST]
    assert run(*argv, "--mine-negatives", "2") == 2
    assert "--mine-negatives K and --corpus FILE go together" in capsys.readouterr().err
    assert run(*argv, "--mine-negatives", "2", "--corpus", corpus) == 0
    mined = next(line for line in capsys.readouterr().err.splitlines() if "BM25 negatives" in line)
    positives = sum(1 for _, p, _ in groups(8) if "the film was great" in p)
    assert f"{positives} hit(s) that were the group's own positive dropped" in mined, mined


def test_last_token_pooling_without_an_eos_token_is_refused_with_the_fix(tmp_path, capsys):
    tokenizer = qwen2_like()
    tokenizer.eos_token = None
    folder = save_checkpoint(tmp_path / "base", "qwen2", tokenizer, use_sliding_window=False)
    data = write(tmp_path / "g.jsonl", layout_rows("flag", groups(8)))
    argv = ["train", "--task", "embedding", "--model", folder, "--train", data, "--output", tmp_path / "out", *FAST]
    assert run(*argv) == 2
    err = capsys.readouterr().err
    assert "--pooling last" in err and "has no eos token" in err and "pooling='mean'" in err


def test_predict_writes_the_vectors_every_consumer_gives(trained, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    folder, _ = trained
    log = json.loads((folder / "training_log.json").read_text())
    assert [e for e in log if "loss" in e and "grad_norm" in e]  # each step's loss and gradient norm
    data = write(tmp_path / "texts.jsonl", [{"text": t} for t in TEXTS])
    assert (
        run("predict", "--model", folder, "--data", data, "--output", tmp_path / "q.jsonl", "--prompt-name", "query")
        == 0
    )
    got = torch.tensor([json.loads(line)["embedding"] for line in (tmp_path / "q.jsonl").read_text().splitlines()])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer("bad")["input_ids"][-1] == tokenizer.eos_token_id  # the saved tokenizer appends eos
    model = stable_models.from_pretrained(folder).eval()
    with torch.no_grad():
        ours = model(**tokenizer([f"query: {t}" for t in TEXTS], padding=True, return_tensors="pt")).pooler_output
    assert (got - ours).abs().max() <= 1e-5
    encoder = SentenceTransformer(str(folder))  # no remote code; the saved prompt
    assert (torch.tensor(encoder.encode_query(TEXTS)) - got).abs().max() <= 1e-5


def test_evaluate_reports_retrieval_over_the_files_documents(trained, tmp_path, capsys):
    folder, data = trained
    assert run("evaluate", "--model", folder, "--data", data, "--report-dir", tmp_path) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["queries"] == 16 and report["documents"] == len({d for g in groups(16) for d in g[1] + g[2]})
    for key in ("ndcg@10", "mrr@10", "recall@10", "recall@20", "recall@100"):
        assert 0.0 <= report[key] <= 1.0, key
    assert report["recall@100"] == 1.0  # fewer documents than 100: each query finds its own
    assert run("evaluate", "--model", folder, "--data", data, "--calibrate") == 2
    assert "an embedder has none to fit" in capsys.readouterr().err


def test_evaluate_adds_the_corpus_and_reports_bm25_and_the_untrained_start_beside_the_embedder(
    trained, base, tmp_path, capsys
):
    """--corpus documents join the file's; BM25 ranks them as bm25s does (here each query's one shared word picks its
    positive: NDCG 1); the untrained start (the card's local base_model) reports what evaluate gives for that model
    saved as an embedder with the trained folder's tokenizer; the lift is the difference."""
    from stable_models.model_kinds import EMBEDDER_KIND

    folder, _ = trained
    words = ["alpha", "bravo", "charlie", "delta", "echo"]
    data = write(tmp_path / "words.jsonl", [{"query": w, "pos": [f"{w} doc"], "neg": ["plain doc"]} for w in words])
    corpus = write(tmp_path / "corpus.jsonl", [{"text": t} for t in ["plain doc", "other doc", "more text"]])
    assert run("evaluate", "--model", folder, "--data", data, "--corpus", corpus, "--report-dir", tmp_path / "r") == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["documents"] == len(words) + 3  # "plain doc" once
    assert report["bm25"]["ndcg@10"] == 1.0 and report["bm25"]["mrr@10"] == 1.0
    assert report["untrained"]["model"] == str(base)
    for baseline in ("bm25", "untrained"):
        assert report["lift"][baseline]["ndcg@10"] == pytest.approx(report["ndcg@10"] - report[baseline]["ndcg@10"])
    table = capsys.readouterr().out
    assert "embedder" in table and "bm25" in table and "untrained" in table

    config = stable_models.from_pretrained(folder).config
    start = EMBEDDER_KIND.load(
        base, pooling=config.classifier_pooling, prompts=config.embedding_prompts, dtype=torch.float32
    )
    from transformers import AutoTokenizer

    start.save_pretrained(tmp_path / "start")
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / "start")
    argv = ["evaluate", "--model", tmp_path / "start", "--data", data, "--corpus", corpus]
    assert run(*argv, "--report-dir", tmp_path / "s") == 0
    untrained = json.loads((tmp_path / "s" / "report.json").read_text())
    assert "untrained" not in untrained  # its card names no base model
    for key in ("ndcg@10", "mrr@10", "recall@10"):
        assert report["untrained"][key] == pytest.approx(untrained[key], abs=1e-9), key


def test_the_readme_embedding_commands_run_as_written(base, tmp_path, monkeypatch):
    import shlex

    from documented import commands

    lines = commands("--task embedding")
    assert [line.split()[1] for line in lines] == ["train", "evaluate", "predict"]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "queries.jsonl", layout_rows("flag", groups(12)))
    write(tmp_path / "test_queries.jsonl", layout_rows("flag", groups(16)[12:]))
    write(tmp_path / "passages.jsonl", [{"text": t} for t in TEXTS])
    for line in lines:
        argv = shlex.split(line.replace("./SmolLM2-135M-Instruct", str(base)))[1:]
        assert cli.main(argv + (FAST if argv[0] == "train" else [])) == 0, line
    import pyarrow.parquet as pq

    vectors = pq.read_table(tmp_path / "vectors.parquet").to_pylist()
    assert [row["text"] for row in vectors] == TEXTS and len(vectors[0]["embedding"]) == 32


def test_an_adapter_folder_predicts_the_merged_runs_vectors_and_its_row_says_merge_first(trained, base, tmp_path):
    from stable_models.consumers import folder_table

    folder, data = trained
    argv = ["train", "--task", "embedding", "--model", base, "--train", data, "--output", tmp_path / "adapter", *FAST]
    assert run(*argv, "--query-prompt", "query: ", "--dtype", "fp32", "--save-adapter") == 0
    texts = write(tmp_path / "texts.jsonl", [{"text": t} for t in TEXTS])
    vectors = {}
    for name, model in (("merged", folder), ("adapter", tmp_path / "adapter")):
        assert run("predict", "--model", model, "--data", texts, "--output", tmp_path / f"{name}.jsonl") == 0
        lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        vectors[name] = torch.tensor([json.loads(line)["embedding"] for line in lines])
    assert (vectors["adapter"] - vectors["merged"]).abs().max() <= 1e-5
    cells = folder_table(tmp_path / "adapter")
    assert cells[0].ok and not any(cell.ok for cell in cells[1:])


def test_no_include_prompt_trains_predicts_and_evaluates_without_the_prompts_tokens(base, tmp_path, capsys):
    """--pooling mean --no-include-prompt: saved as include_prompt false; training (packed) and predict leave the
    prompt's tokens out of the mean, so predict --prompt-name query gives sentence-transformers' encode_query (no
    remote code) and the library's vectors with prompt_length; --engine vllm and last-token pooling are refused."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    data = write(tmp_path / "groups.jsonl", layout_rows("flag", groups(16)))
    argv = ["train", "--task", "embedding", "--model", base, "--train", data, *FAST, "--dtype", "fp32"]
    argv += ["--query-prompt", "query: ", "--no-include-prompt"]
    assert run(*argv, "--output", tmp_path / "last") == 2
    assert "add --pooling mean" in capsys.readouterr().err.splitlines()[-1]
    assert run(*argv, "--pooling", "mean", "--output", tmp_path / "model") == 0
    folder = tmp_path / "model"
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["include_prompt"] is False
    texts = write(tmp_path / "texts.jsonl", [{"text": t} for t in ["the film was great", "a dull plot"]])
    out = tmp_path / "q.jsonl"
    assert run("predict", "--model", folder, "--data", texts, "--output", out, "--prompt-name", "query") == 0
    got = torch.tensor([json.loads(line)["embedding"] for line in out.read_text().splitlines()])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = stable_models.from_pretrained(folder).eval()
    batch = tokenizer([f"query: {t}" for t in ["the film was great", "a dull plot"]], padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = model(**batch, prompt_length=stable_models.prompt_length(tokenizer, "query: ")).pooler_output
        counted = model(**batch).pooler_output
    assert (got - ours).abs().max() <= 1e-5 and (got - counted).abs().max() > 1e-4
    encoder = SentenceTransformer(str(folder))
    assert (torch.tensor(encoder.encode_query(["the film was great", "a dull plot"])) - got).abs().max() <= 1e-5
    assert run("evaluate", "--model", folder, "--data", data, "--report-dir", tmp_path / "r") == 0
    assert run("predict", "--model", folder, "--data", texts, "--output", tmp_path / "v.jsonl", "--engine", "vllm") == 2
    assert "include_prompt=False" in capsys.readouterr().err.splitlines()[-1]
