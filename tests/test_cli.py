"""`stable-models train / evaluate / predict` end to end on a tiny Qwen2 causal LM (a real byte-level BPE tokenizer)
and small data files in every format. In-process (`cli.main`), except one run of the installed console script."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from architectures import BY_NAME
from safetensors.torch import load_file
from test_doctor import QLORA_SIZES, save_checkpoint
from tiny_tokenizers import qwen2_like
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import stable_models
from stable_models import cli
from stable_models.cli import classification_data, data, sharded_scores
from stable_models.cli.classification_data import encoded
from stable_models.cli.data import read_table
from stable_models.cli.fine_tuning import decoder_layer_linears

pandas = pytest.importorskip("pandas")
datasets = pytest.importorskip("datasets")

WORDS = ["great", "awful", "fine", "dull", "loved", "bad", "good", "plot", "actor", "film"]
POSITIVE = {"great", "loved", "good", "fine"}


def review(i):
    """Short texts whose label follows from their words, so a few steps learn something."""
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(1 + i % 4)]
    return " ".join(words), sum(w in POSITIVE for w in words) > len(words) / 2


def rows(kind, count=40):
    out = []
    for i in range(count):
        text, positive = review(i)
        label = {
            "string": "pos" if positive else "neg",
            "integer": int(positive) + (i % 5 == 0),  # three classes: 0, 1, 2
            "multi": ["pos"] + (["long"] if len(text) > 12 else [])
            if positive
            else (["long"] if len(text) > 12 else []),
            "regression": float(sum(w in POSITIVE for w in text.split())) / len(text.split()),
            "pair": "pos" if positive else "neg",
        }[kind]
        row = {"text": text, "label": label}
        if kind == "pair":
            row["query"] = "is it good"
        out.append(row)
    return out


def write(path, table):
    path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("base"), "qwen2", qwen2_like())


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory):
    """A string-label classifier trained by the CLI (LoRA, merged)."""
    folder = tmp_path_factory.mktemp("runs")
    data = write(folder / "train.jsonl", rows("string"))
    output = folder / "model"
    assert cli.main(["train", "--model", str(base), "--train", str(data), "--output", str(output), *FAST]) == 0
    return output, data


FAST = ["--max-steps", "6", "--eval-steps", "3", "--batch-size", "4", "--lr", "5e-3", "--early-stopping", "0"]


def run(*args):
    return cli.main([str(a) for a in args])


def forward_alone(folder, texts, pairs=None):
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return torch.cat(
            [
                model(**tokenizer(t, p, return_tensors="pt", truncation=True)).logits
                for t, p in zip(texts, pairs, strict=True)
            ]
        )


def test_train_saves_a_classifier_that_loads_without_the_library(trained):
    output, _ = trained
    config = json.loads((output / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["problem_type"] == "single_label_classification"
    assert config["architectures"] == ["Qwen2ForSequenceClassification"] and "auto_map" in config
    log = json.loads((output / "training_log.json").read_text())
    assert [e["step"] for e in log if "eval_loss" in e] == [3, 6]
    assert all(e.get("grad_norm") is not None for e in log if "loss" in e)
    code = (
        "import json, sys; from transformers import AutoModelForSequenceClassification as A; "
        f"m = A.from_pretrained({str(output)!r}, trust_remote_code=True); "
        "assert 'stable_models' not in sys.modules; print(type(m).__name__, sorted(n for n, _ in m.named_parameters() "
        "if 'lora' in n))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "StableQwen2ForSequenceClassification []" in done.stdout, done.stderr[-2000:]


def test_predict_keeps_the_input_order_and_equals_the_forward(trained, tmp_path, monkeypatch):
    output, data = trained
    monkeypatch.setattr(sharded_scores, "SCORING_CHUNK", 7)  # streamed: several chunks, each sorted by length
    texts = [r["text"] for r in rows("string")][::-1]  # lengths out of order: batches are sorted by length
    write(tmp_path / "new.jsonl", [{"text": t} for t in texts])
    assert run("predict", "--model", output, "--data", tmp_path / "new.jsonl", "--output", tmp_path / "p.jsonl") == 0
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [p["text"] for p in predicted] == texts
    expected = forward_alone(output, texts, [None] * len(texts)).softmax(-1)
    got = torch.tensor([[p["probabilities"]["neg"], p["probabilities"]["pos"]] for p in predicted])
    assert (got - expected).abs().max() <= 1e-5
    assert [p["label"] for p in predicted] == [["neg", "pos"][i] for i in expected.argmax(-1).tolist()]
    assert run("predict", "--model", output, "--data", tmp_path / "new.jsonl", "--output", tmp_path / "p.csv") == 0
    table = pandas.read_csv(tmp_path / "p.csv")
    assert list(table.columns) == ["text", "label", "score", "p_neg", "p_pos"]
    assert torch.tensor(table[["p_neg", "p_pos"]].values) == pytest.approx(got.double(), abs=1e-6)


def test_predict_progress_advances_batch_by_batch_within_a_chunk(trained, tmp_path, monkeypatch):
    """The bar moves as each batch is scored, not once per SCORING_CHUNK (4,096 rows: minutes of a CPU's scoring)."""
    import tqdm.auto

    output, data = trained
    updates = []

    class Recording(tqdm.auto.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    texts = [r["text"] for r in rows("string")][:10]
    write(tmp_path / "new.jsonl", [{"text": t} for t in texts])
    command = ["predict", "--model", output, "--data", tmp_path / "new.jsonl", "--output", tmp_path / "p.jsonl"]
    assert run(*command, "--batch-size", "2") == 0
    assert sum(updates) == len(texts) and len(updates) >= len(texts) // 4, updates  # one chunk, several batches


def test_evaluate_reports_and_calibrate_folds_the_temperature_into_the_head(trained, tmp_path, capsys):
    output, data = trained
    folder = tmp_path / "model"
    shutil.copytree(output, folder)
    texts = [r["text"] for r in rows("string")]
    before = forward_alone(folder, texts, [None] * len(texts))
    assert run("evaluate", "--model", folder, "--data", data) == 0
    report = json.loads((folder / "evaluation" / "report.json").read_text())
    assert report["examples"] == 40 and set(report["per_class"]) == {"neg", "pos"}
    assert {"accuracy", "f1_macro", "f1_micro", "roc_auc", "ece", "confusion_matrix"} <= set(report)
    assert sum(map(sum, report["confusion_matrix"])) == 40
    assert forward_alone(folder, texts[:3], [None] * 3).equal(before[:3])  # evaluate alone changes nothing
    names = {"confusion_matrix.png", "reliability.png", "training_curves.png"}
    assert names <= {p.name for p in (folder / "evaluation").iterdir()}

    assert run("evaluate", "--model", folder, "--data", data, "--calibrate") == 0
    report = json.loads((folder / "evaluation" / "report.json").read_text())
    temperature = report["calibration"]["temperature"]
    assert abs(temperature - 1) > 1e-3 and report["calibration"]["nll_after"] < report["calibration"]["nll_before"]
    after = forward_alone(folder, texts, [None] * len(texts))  # every consumer sees the calibrated logits
    expected = before / temperature
    assert (after - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max().item())  # fp32, relative
    assert json.loads((folder / "config.json").read_text())["calibration_temperature"] == pytest.approx(temperature)
    assert "temperature" in capsys.readouterr().out


def test_calibrate_in_python_is_the_cli_calibration(trained, tmp_path):
    """stable_models.calibrate (no CLI) fits the temperature `evaluate --calibrate` fits on the same data, folds it
    into the head the same way, and takes label names as the file holds them."""
    output, data = trained
    folder = tmp_path / "model"
    shutil.copytree(output, folder)
    assert run("evaluate", "--model", folder, "--data", data, "--calibrate") == 0
    by_cli = json.loads((folder / "evaluation" / "report.json").read_text())["calibration"]

    model = stable_models.from_pretrained(str(output), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(output)
    table = rows("string")
    texts = [r["text"] for r in table]
    with torch.no_grad():
        before = model(**tokenizer(texts[:4], padding=True, return_tensors="pt")).logits
    fitted = stable_models.calibrate(model, tokenizer, texts, [r["label"] for r in table])
    assert fitted["temperature"] == pytest.approx(by_cli["temperature"], rel=1e-6)
    assert fitted["nll_after"] < fitted["nll_before"] and fitted["nll_before"] == pytest.approx(by_cli["nll_before"])
    with torch.no_grad():
        after = model(**tokenizer(texts[:4], padding=True, return_tensors="pt")).logits
    assert (after - before / fitted["temperature"]).abs().max() <= 1e-5 * max(1.0, before.abs().max().item())
    assert model.config.calibration_temperature == pytest.approx(fitted["temperature"])
    with pytest.raises(Exception, match=r"calibrate\(labels=...\): labels \['meh'\] are not among the model's labels"):
        stable_models.calibrate(model, tokenizer, texts[:2], ["pos", "meh"])


def test_training_flags_reach_trainer_and_peft(base, tmp_path, recwarn):
    """--gradient-checkpointing, --attn-implementation, --lora-target / --lora-dropout, --weight-decay,
    --warmup-ratio and --scheduler land in TrainingArguments and the LoRA config, and LoRA still learns under
    gradient checkpointing (its B matrices, zero at the start, move). Checkpointing is asked for under the name the
    installed transformers takes (5.25 warns on `gradient_checkpointing`)."""
    data = write(tmp_path / "train.jsonl", rows("string"))
    flags = ["--gradient-checkpointing", "--attn-implementation", "eager", "--lora-target", "q_proj, v_proj"]
    flags += ["--lora-dropout", "0.1", "--weight-decay", "0.01", "--warmup-ratio", "0.5", "--scheduler", "cosine"]
    flags += ["--keep-checkpoints"]
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *FAST, *flags) == 0
    checkpoint = sorted((tmp_path / "m" / "checkpoints").glob("checkpoint-*"))[-1]
    arguments = torch.load(checkpoint / "training_args.bin", weights_only=False)
    assert arguments.gradient_checkpointing and arguments.weight_decay == 0.01
    assert not [str(w.message) for w in recwarn if "`gradient_checkpointing` is deprecated" in str(w.message)]
    assert arguments.lr_scheduler_type == "cosine" and arguments.warmup_steps == 3  # half of 6 steps
    adapter = json.loads((checkpoint / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {"q_proj", "v_proj"} and adapter["lora_dropout"] == 0.1
    weights = load_file(checkpoint / "adapter_model.safetensors")
    lora_b = [value for key, value in weights.items() if "lora_B" in key]
    assert len(lora_b) == 4 and all(value.abs().max() > 0 for value in lora_b)  # 2 layers x q, v


def test_train_in_process_leaves_the_environment_as_it_was(base, tmp_path):
    """transformers 4.57's TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION=bf16 process-wide: after an
    in-process bf16 `train`, the caller's next Trainer run (and the processes it starts) trained in bf16."""
    data = write(tmp_path / "train.jsonl", rows("string"))
    before = dict(os.environ)
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *FAST, "--dtype", "bf16") == 0
    assert dict(os.environ) == before


def test_bad_training_flags_are_one_line_errors(base, tmp_path, capsys):
    data = write(tmp_path / "train.jsonl", rows("string"))
    common = ["train", "--model", base, "--train", data, "--output", tmp_path / "m", *FAST]
    assert run(*common, "--lora-target", "no_such_layer") == 2
    assert "--lora-target no_such_layer" in capsys.readouterr().err
    assert run(*common, "--attn-implementation", "no_such_kernel", "--overwrite") == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the "[train] loading ..." progress line
    assert error.startswith("stable-models: error: --model") and "no_such_kernel" in error


@pytest.mark.parametrize("missing", ["sklearn", "pandas", "accelerate"])
def test_without_the_cli_extra_the_commands_stop_before_any_work(missing, base, tmp_path, monkeypatch, capsys):
    """A base install has the console script but not the cli extra: one line naming the fix, exit 2, nothing
    written (before: training ran and died at the first evaluation with a scikit-learn traceback)."""
    data = write(tmp_path / "train.jsonl", rows("string"))
    monkeypatch.setitem(sys.modules, missing, None)  # what an uninstalled package looks like to the import system
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *FAST) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "pip install 'stable_models[cli]'" in error
    assert not (tmp_path / "m").exists()
    if missing != "accelerate":  # Trainer's dependency: evaluate and predict run without it
        assert run("predict", "--model", base, "--data", data, "--output", tmp_path / "p.jsonl") == 2
        assert "stable_models[cli]" in capsys.readouterr().err and not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("command", ["train", "evaluate", "predict", "doctor"])
def test_help_prints_each_default_once(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    options = re.split(r"\n  (?=-)", capsys.readouterr().out)  # one chunk per option
    assert len(options) > 5
    assert all(chunk.count("default") <= 1 for chunk in options), [c for c in options if c.count("default") > 1]
    assert not any("(default: None)" in chunk or "(default: False)" in chunk for chunk in options)


@pytest.mark.parametrize("kind", ["integer", "multi", "regression", "pair"])
def test_label_kinds_decide_the_task(kind, base, tmp_path):
    table = rows(kind)
    data = write(tmp_path / "train.jsonl", table)
    pair = ["--text-pair-key", "query"] if kind == "pair" else []
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *pair, *FAST) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    task, names = {
        "integer": ("single_label_classification", ["0", "1", "2"]),
        "multi": ("multi_label_classification", ["long", "pos"]),
        "regression": ("regression", ["score"]),
        "pair": ("single_label_classification", ["neg", "pos"]),
    }[kind]
    assert config["problem_type"] == task and list(config["id2label"].values()) == names
    calibrate = ["--calibrate"] if kind == "multi" else []
    assert run("evaluate", "--model", tmp_path / "m", "--data", data, *pair, *calibrate) == 0
    report = json.loads((tmp_path / "m" / "evaluation" / "report.json").read_text())
    assert {"mse", "mae", "pearson", "spearman"} <= set(report) if kind == "regression" else "f1_macro" in report
    assert run("predict", "--model", tmp_path / "m", "--data", data, *pair, "--output", tmp_path / "p.jsonl") == 0
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    pairs = [r["query"] for r in table] if kind == "pair" else [None] * len(table)
    logits = forward_alone(tmp_path / "m", [r["text"] for r in table], pairs)
    if kind == "regression":
        assert torch.tensor([p["score"] for p in predicted]) == pytest.approx(logits.squeeze(-1), abs=1e-5)
    elif kind == "multi":
        thresholds = json.loads((tmp_path / "m" / "config.json").read_text())["multi_label_thresholds"]
        assert len(thresholds) == 2 and report["calibration"]["thresholds"] == dict(zip(names, thresholds, strict=True))
        chosen = [
            [n for n, p, t in zip(names, row, thresholds, strict=True) if p >= t] for row in logits.sigmoid().tolist()
        ]
        assert [p["labels"] for p in predicted] == chosen
    else:
        got = torch.tensor([list(p["probabilities"].values()) for p in predicted])
        assert (got - logits.softmax(-1)).abs().max() <= 1e-5


def test_every_file_format_gives_the_same_rows(tmp_path):
    table = pandas.DataFrame(rows("string", 12))
    table.to_csv(tmp_path / "d.csv", index=False)
    table.to_csv(tmp_path / "d.tsv", sep="\t", index=False)
    table.to_csv(tmp_path / "d.csv.gz", index=False)
    table.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    table.to_json(tmp_path / "d.json", orient="records")
    table.to_parquet(tmp_path / "d.parquet")
    datasets.Dataset.from_pandas(table).save_to_disk(str(tmp_path / "saved"))
    expected = table.to_dict("records")
    for name in ("d.csv", "d.tsv", "d.csv.gz", "d.jsonl", "d.json", "d.parquet", "saved"):
        assert read_table(tmp_path / name).to_list() == expected, name


def test_checks_run_over_arrow_batches_and_name_the_first_bad_row(tmp_path, monkeypatch):
    """Vectorized over batches of CHECK_BATCH rows: the first bad row is counted across batches."""
    monkeypatch.setattr(data, "CHECK_BATCH", 5)
    table = rows("string", 30)
    table[11]["label"], table[23]["label"] = None, None
    table[17]["text"] = "   "
    path = write(tmp_path / "bad.jsonl", table)
    loaded = read_table(path)
    with pytest.raises(data.CliError, match=r"text missing or empty in 1 row\(s\), first at row 18"):
        data.check_texts(loaded, path, "text")
    with pytest.raises(data.CliError, match=r"'label' is missing or NaN in 2 row\(s\), first at row 12"):
        classification_data.label_problem_type(loaded, "label", path)


def test_tables_are_memory_mapped_and_tokenized_once(tmp_path, base):
    """A file becomes an Arrow table on disk (memory-mapped, not rows in memory); tokenizing it again (a second rank,
    a second run) reads the cache that the first `map` wrote."""
    path = write(tmp_path / "train.jsonl", rows("string", 12))
    table = read_table(path)
    assert table.cache_files and all(Path(f["filename"]).suffix == ".arrow" for f in table.cache_files)
    tokenizer = AutoTokenizer.from_pretrained(base)
    args = cli.parse(["train", "--model", "m", "--train", str(path), "--output", "o"])
    first = encoded(table, tokenizer, args, "single_label_classification", {"neg": 0, "pos": 1}, 64)
    again = encoded(read_table(path), tokenizer, args, "single_label_classification", {"neg": 0, "pos": 1}, 64)
    assert first.cache_files == again.cache_files and first["input_ids"] == again["input_ids"]
    assert first["length"] == [len(i) for i in first["input_ids"]]


def test_resume_continues_from_the_last_checkpoint(base, tmp_path):
    data = write(tmp_path / "train.jsonl", rows("string"))
    common = ["train", "--model", base, "--train", data, "--output", tmp_path / "m", "--batch-size", "4"]
    assert run(*common, "--max-steps", "4", "--eval-steps", "2", "--early-stopping", "0", "--keep-checkpoints") == 0
    assert (tmp_path / "m" / "checkpoints" / "checkpoint-4").is_dir()
    assert run(*common, "--max-steps", "6", "--eval-steps", "2", "--early-stopping", "0") == 2  # not empty
    assert run(*common, "--max-steps", "6", "--eval-steps", "2", "--early-stopping", "0", "--resume") == 0
    log = json.loads((tmp_path / "m" / "training_log.json").read_text())
    trained_steps = [e["step"] for e in log if "loss" in e and "train_runtime" not in e]
    assert trained_steps[-2:] == [5, 6] and 4 in trained_steps  # steps 1-4 from the first run's state


def test_options_file_and_loss_options(base, tmp_path):
    data = write(tmp_path / "train.jsonl", rows("string"))
    options = {"max-steps": 2, "eval-steps": 1, "batch-size": 4, "class-weights": "balanced", "label-smoothing": 0.1}
    (tmp_path / "options.yaml").write_text("".join(f"{k}: {v}\n" for k, v in options.items()))
    args = ["train", "--config", tmp_path / "options.yaml", "--model", base, "--train", data]
    assert run(*args, "--output", tmp_path / "m", "--early-stopping", "0") == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    counts = [sum(r["label"] == name for r in rows("string")) for name in ("neg", "pos")]
    held_out = round(len(rows("string")) * 0.1)
    assert config["label_smoothing"] == 0.1 and len(config["class_weights"]) == 2
    assert config["class_weights"][0] / config["class_weights"][1] == pytest.approx(
        counts[1] / counts[0], rel=held_out / min(counts) * 2
    )
    (tmp_path / "bad.yaml").write_text("epochz: 3\n")
    assert run("train", "--config", tmp_path / "bad.yaml") == 2


def bad_inputs(tmp_path, base):
    """(name, argv, the words the one-line error must hold); each leaves nothing behind."""
    good = write(tmp_path / "good.jsonl", rows("string", 12))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    unseen = write(tmp_path / "unseen.jsonl", [{"text": "a film", "label": "meh"}] + rows("string", 4))
    mixed = write(tmp_path / "mixed.jsonl", [{"text": "a", "label": "pos"}, {"text": "b", "label": 1}] * 3)
    nan = tmp_path / "nan.csv"
    nan.write_text("text,label\na film,1\nthe plot,\ngood,0\n")
    pairs = write(tmp_path / "pairs.jsonl", [{"text": "a", "query": "q", "label": 1}, {"text": "b", "label": 0}] * 3)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    train = ["train", "--model", base, "--output", out]
    return [
        ("missing column", [*train, "--train", good, "--label-key", "stars"], "no column 'stars'"),
        ("empty file", [*train, "--train", empty], "is empty"),
        ("unseen eval label", [*train, "--train", good, "--eval", unseen], "'meh'"),
        ("mixed kinds", [*train, "--train", mixed], "mixes kinds"),
        ("nan label", [*train, "--train", nan], "missing or NaN in 1 row(s), first at row 2"),
        ("pair side missing", [*train, "--train", pairs, "--text-pair-key", "query"], "text pair missing"),
        ("not a checkpoint", ["train", "--model", tmp_path, "--train", good, "--output", out], "not a checkpoint"),
        ("output exists", ["train", "--model", base, "--train", good, "--output", existing], "exists and is not empty"),
        ("predict output exists", ["predict", "--model", base, "--data", good, "--output", good], "exists"),
        ("evaluate a base model", ["evaluate", "--model", base, "--data", good], "not a classifier"),
    ]


def test_bad_input_is_one_line_exit_2_and_touches_nothing(base, tmp_path, capfd):
    for name, argv, words in bad_inputs(tmp_path, base):
        before = sorted(p.name for p in tmp_path.rglob("*"))
        snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        assert run(*argv) == 2, name
        err = capfd.readouterr().err.strip().splitlines()
        assert err and err[-1].startswith("stable-models: error: ") and words in err[-1], (name, err[-3:])
        assert "Traceback" not in "\n".join(err), name
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, name
        assert all(p.read_bytes() == data for p, data in snapshot.items()), name


def test_console_script_and_module_entry_point(tmp_path):
    script = shutil.which("stable-models", path=str(Path(sys.executable).parent))
    assert script, "pyproject.toml declares the stable-models console script"
    done = subprocess.run([script, "train", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "(default: 16)" in done.stdout and "--qlora" in done.stdout
    command = [sys.executable, "-m", "stable_models", "train", "--train", "x.csv"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "stable-models: error: train needs --model, --output"


def test_the_readme_commands_run_as_written(base, tmp_path, monkeypatch):
    from documented import commands

    lines = commands("stable-models train")
    assert [line.split()[1] for line in lines] == ["train", "evaluate", "predict"]
    monkeypatch.chdir(tmp_path)
    table = pandas.DataFrame(rows("string"))
    table.to_csv("reviews.csv", index=False)
    table.to_csv("test.csv", index=False)
    table[["text"]].to_csv("new.csv", index=False)
    for line in lines:
        argv = shlex.split(line.replace("./SmolLM2-135M-Instruct", str(base)))[1:]
        assert cli.main(argv) == 0, line
    scores = [json.loads(line) for line in open("scores.jsonl")]
    assert [s["text"] for s in scores] == list(table["text"]) and {s["label"] for s in scores} <= {"neg", "pos"}
    assert json.loads(open("clf/evaluation/report.json").read())["calibration"]["temperature"] > 0


def test_early_stopping_ends_a_run_that_stopped_improving(base, tmp_path):
    data = write(tmp_path / "train.jsonl", rows("string"))
    args = ["train", "--model", base, "--train", data, "--output", tmp_path / "m", "--batch-size", "4"]
    assert run(*args, "--max-steps", "20", "--eval-steps", "1", "--lr", "1e-12", "--early-stopping", "2") == 0
    log = json.loads((tmp_path / "m" / "training_log.json").read_text())
    assert [e["step"] for e in log if "eval_loss" in e] == [1, 2, 3]  # macro F1 never improved on step 1's


def test_the_preflight_stops_a_checkpoint_with_nan_weights_before_step_1(tmp_path):
    poisoned = save_checkpoint(tmp_path / "poisoned", "qwen2", qwen2_like(), poison=True)
    data = write(tmp_path / "train.jsonl", rows("string"))
    with pytest.raises(
        SystemExit,
        match=r"pre-flight check failed: non-finite .*\(first at model.layers.1.mlp.up_proj\)\. .*doctor --model",
    ):
        run("train", "--model", poisoned, "--train", data, "--output", tmp_path / "m", *FAST)
    assert not (tmp_path / "m" / "checkpoints").exists()


def test_qlora_trains_4bit_and_saves_a_full_precision_merged_model(tmp_path):
    pytest.importorskip("bitsandbytes")
    base = save_checkpoint(tmp_path / "base", "qwen2", qwen2_like(), **QLORA_SIZES)
    data = write(tmp_path / "train.jsonl", rows("string"))
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", "--qlora", *FAST) == 0
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert "quantization_config" not in saved
    weights = load_file(tmp_path / "m" / "model.safetensors")
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)  # full precision, not packed 4-bit
    assert not any("lora" in key for key in weights)
    texts = [r["text"] for r in rows("string")][:4]
    assert torch.isfinite(forward_alone(tmp_path / "m", texts, [None] * 4)).all()


def test_lora_finds_the_linear_layers_of_a_legacy_class(tmp_path):
    """GPT-2's attention and MLP are Conv1D layers, not nn.Linear: LoRA targets them too."""
    gpt2 = save_checkpoint(tmp_path / "gpt2", "gpt2", qwen2_like())
    data = write(tmp_path / "train.jsonl", rows("string"))
    assert decoder_layer_linears(BY_NAME["gpt2"].causal_lm_class.from_pretrained(gpt2)) == [
        "c_attn",
        "c_fc",
        "c_proj",
    ]
    assert run("train", "--model", gpt2, "--train", data, "--output", tmp_path / "m", *FAST) == 0
