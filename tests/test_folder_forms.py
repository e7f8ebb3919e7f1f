"""Every folder `train` writes, task x form (merged, adapter, generative), loaded by every consumer its row of the
consumer matrix names that runs in this venv (vLLM: tests/serving): each "as trained" one gives `predict`'s scores on
the merged folder (fp32, 1e-5), each other one refuses with one line or gives other scores. The user's path of issue
57: `stable_models.from_pretrained` on a `--save-adapter` folder trained with mean pooling read neither its labels nor
its pooling (probabilities 0.037 off predict's)."""

import json

import pytest
import torch
from test_doctor import save_checkpoint
from test_ranking_cli import FAST, groups, layout_rows, write
from tiny_tokenizers import qwen2_like
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

import stable_models
from stable_models import cli
from stable_models.consumers import folder_table

pytest.importorskip("datasets")
TOLERANCE = 1e-5
WORDS = ["great", "bad", "fine"]
TASKS = {  # task: (train rows, predict rows, train options)
    "classification": (
        [{"text": f"the film was {w} {i}", "label": w} for i in range(8) for w in WORDS],
        [{"text": t} for t in ("the film was great", "bad", "a fine and dull plot")],
        ["--pooling", "mean"],  # the issue's case: a pooling the base's defaults do not give
    ),
    "preference": (
        [{"prompt": f"q{i} ", "chosen": "a great film", "rejected": f"bad {i}"} for i in range(12)],
        [{"text": t} for t in ("a great film", "bad", "a fine plot")],
        [],
    ),
    "ranking": (
        layout_rows("flag", groups(8)),
        [{"query": "is it great", "document": d} for d in ("the film was great", "bad", "a dull plot")],
        ["--template", "qwen3", "--init-from-tokens", "the", "a"],
    ),
}
FORMS = {"merged": [], "adapter": ["--save-adapter"], "generative": ["--save-generative"]}
CASES = [(task, form) for task in TASKS for form in ("merged", "adapter")] + [("ranking", "generative")]
_trained = {}


def run(*args):
    return cli.main([str(a) for a in args])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("base"), "qwen2", qwen2_like(), use_sliding_window=False)


def trained(base, root, task, form):
    """The folder train writes for this task and form (the generative one beside a merged reranker), and predict's
    scores of the task's rows on the merged folder."""
    key = (task, "generative" if form == "generative" else form)
    if key not in _trained:
        rows, predicted, options = TASKS[task]
        folder = root / f"{task}-{form}"
        folder.mkdir()
        data = write(folder / "train.jsonl", rows)
        argv = ["train", "--model", base, "--train", data, "--output", folder / "out", "--task", task, *FAST]
        assert run(*argv, *options, *FORMS[form]) == 0
        out = folder / "out" / "generative" if form == "generative" else folder / "out"
        _trained[key] = (out, folder / "out", write(folder / "predict.jsonl", predicted))
    return _trained[key]


def predicted(folder, data, tmp_path):
    """predict's scores: a classifier's probabilities in label order, a reward, a reranker's score."""
    out = tmp_path / f"p{len(list(tmp_path.iterdir()))}.jsonl"
    assert run("predict", "--model", folder, "--data", data, "--output", out) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    if "probabilities" in rows[0]:
        return torch.tensor([list(r["probabilities"].values()) for r in rows], dtype=torch.float64)
    return torch.tensor([[r.get("reward", r.get("score"))] for r in rows], dtype=torch.float64)


def inputs(tokenizer, data, reward):
    """The token ids predict feeds, rendered as the consumer matrix's second column says (a reward model's response
    ends in eos, as TRL renders it)."""
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    if "document" in rows[0]:
        chats = [
            [{"role": "query", "content": r["query"]}, {"role": "document", "content": r["document"]}] for r in rows
        ]
        return [tokenizer.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"] for c in chats]
    return [tokenizer(r["text"] + (tokenizer.eos_token if reward else ""))["input_ids"] for r in rows]


def as_predicted(logits, config):
    if config.num_labels > 1:
        return logits.double().softmax(-1)
    return logits.double()


def classifier_scores(model, tokenizer, ids):
    batch = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
    with torch.no_grad():
        return as_predicted(model.eval()(**batch).logits, model.config)


def generative_scores(folder, tokenizer, ids):
    how = json.loads((folder / "reranker.json").read_text())
    lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        last = torch.stack([lm(input_ids=torch.tensor([i])).logits[0, -1] for i in ids])
    return (last[:, how["yes_token_id"]] - last[:, how["no_token_id"]]).double()[:, None]


def cross_encoder_scores(folder, data):
    from sentence_transformers import CrossEncoder

    rows = [json.loads(line) for line in data.read_text().splitlines()]
    encoder = CrossEncoder(str(folder), trust_remote_code=True)
    pairs = [(r["query"], r["document"]) for r in rows]
    return torch.tensor(encoder.predict(pairs, activation_fn=torch.nn.Identity()), dtype=torch.float64)[:, None]


def consumer(column, folder, tokenizer, data, reward):
    """A function giving the column's scores for this folder, or None where the consumer does not run here."""
    ids = inputs(tokenizer, data, reward)
    calls = {
        "stable_models": lambda: classifier_scores(
            stable_models.from_pretrained(folder, dtype=torch.float32), tokenizer, ids
        ),
        "transformers, trust_remote_code": lambda: classifier_scores(
            AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True), tokenizer, ids
        ),
        "sentence-transformers": lambda: cross_encoder_scores(folder, data),
    }
    if (folder / "reranker.json").is_file():
        calls["transformers, stock class"] = lambda: generative_scores(folder, tokenizer, ids)
    elif (folder / "config.json").is_file():
        calls["transformers, stock class"] = lambda: classifier_scores(
            AutoModelForSequenceClassification.from_pretrained(folder), tokenizer, ids
        )
    return calls.get(column)


@pytest.mark.parametrize("task, form", CASES, ids=[f"{t}-{f}" for t, f in CASES])
def test_every_loader_the_row_marks_as_trained_gives_predicts_scores_and_the_others_refuse(
    task, form, base, tmp_path_factory, tmp_path
):
    root = tmp_path_factory.getbasetemp() / "forms"
    root.mkdir(exist_ok=True)
    folder, merged, data = trained(base, root, task, form)
    expected = predicted(merged, data, tmp_path)
    if form == "adapter":  # predict merges the adapter as the one loader does
        assert (predicted(folder, data, tmp_path) - expected).abs().max() <= TOLERANCE
    tokenizer = AutoTokenizer.from_pretrained(folder)
    checked = []
    for cell in folder_table(folder):
        call = consumer(cell.consumer, folder, tokenizer, data, task == "preference")
        if call is None or cell.ok is None:
            continue
        checked.append(cell.consumer)
        if cell.ok:
            got = call()
            assert got.shape == expected.shape and (got - expected).abs().max() <= TOLERANCE, cell.line()
            continue
        try:
            got = call()
        except (ValueError, OSError, TypeError, RuntimeError) as error:
            assert "\n" not in str(error).strip() or cell.consumer != "stable_models", str(error)
            continue
        assert got.shape != expected.shape or (got - expected).abs().max() > 1e-3, (cell.line(), "gives predict's")
    assert "stable_models" in checked


def test_the_issues_adapter_loads_with_its_labels_and_pooling(base, tmp_path_factory):
    """Issue 57's reproduction, named: labels from stable_config.json (not LABEL_n), mean pooling, merged; merge=False
    gives peft's model; the lines train printed name loaders that load the folder."""
    from peft import PeftModel

    root = tmp_path_factory.getbasetemp() / "forms"
    root.mkdir(exist_ok=True)
    folder, _, _ = trained(base, root, "classification", "adapter")
    model = stable_models.from_pretrained(folder)
    assert sorted(model.config.id2label.values()) == sorted(WORDS)
    assert model.config.classifier_pooling == "mean" and not isinstance(model, PeftModel)
    assert isinstance(stable_models.from_pretrained(folder, merge=False), PeftModel)
    card = (folder / "README.md").read_text()
    assert "More Information Needed" not in card and "base_model:" in card and "sha256:" in card
    assert "model-index" in card and "stable_models.from_pretrained" in card


def test_a_generative_folder_is_refused_in_one_line_naming_its_loader(base, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "forms"
    root.mkdir(exist_ok=True)
    folder, _, _ = trained(base, root, "ranking", "generative")
    with pytest.raises(ValueError, match=r"generative form.*AutoModelForCausalLM\.from_pretrained") as error:
        stable_models.from_pretrained(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("task", list(TASKS))
def test_predict_writes_parquet_with_the_rows_it_writes_as_json_lines(task, base, tmp_path_factory, tmp_path):
    import pyarrow.parquet as pq

    root = tmp_path_factory.getbasetemp() / "forms"
    root.mkdir(exist_ok=True)
    _, merged, data = trained(base, root, task, "merged")
    for suffix in ("jsonl", "parquet"):
        assert run("predict", "--model", merged, "--data", data, "--output", tmp_path / f"p.{suffix}") == 0
    expected = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert pq.read_table(tmp_path / "p.parquet").to_pylist() == expected


def test_the_evaluator_evaluate_uses_gives_its_report_from_python(base, tmp_path_factory, tmp_path):
    """The classifier's evaluator object, called on the model and token ids without the command line, gives the
    report `stable-models evaluate` writes (the same object computes both)."""
    from stable_models import ClassificationEvaluator
    from stable_models.labels import encode_labels

    root = tmp_path_factory.getbasetemp() / "forms"
    root.mkdir(exist_ok=True)
    _, merged, _ = trained(base, root, "classification", "merged")
    rows = TASKS["classification"][0][:9]
    data = write(tmp_path / "test.jsonl", rows)
    assert run("evaluate", "--model", merged, "--data", data, "--report-dir", tmp_path / "report") == 0
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    model = stable_models.from_pretrained(merged, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(merged)
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    targets = encode_labels([r["label"] for r in rows], model.config.problem_type, model.config.label2id, "rows")
    ids = [tokenizer(r["text"])["input_ids"] for r in rows]
    report = ClassificationEvaluator(names, model.config.problem_type).of_model(model, tokenizer, ids, targets)
    for key in ("accuracy", "f1_macro", "ece"):
        assert report[key] == pytest.approx(written[key], abs=1e-6), key
