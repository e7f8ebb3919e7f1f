"""Bad rows that used to get through, or out as more than one line: empty and blank labels (inside multi-label lists
too), infinite regression labels and preference margins, a broken JSON line, a file that is not UTF-8. Each is one
stderr line naming the file, the column or line and the first bad row, exit code 2, before any model is loaded,
nothing written."""

import json

import pytest
from test_cli import base, rows, run, trained, write  # noqa: F401  (base: the module's tiny Qwen2 checkpoint)

pytest.importorskip("datasets")

BAD_ROW = 31  # of 61, as a user found them


def labelled(label, count=61, row=BAD_ROW, good=None):
    """61 rows of the test's reviews with `label` at `row` (1-based); the others' labels from `good(i)`."""
    table = [{"text": r["text"], "label": good(i) if good else r["label"]} for i, r in enumerate(rows("string", count))]
    table[row - 1]["label"] = label
    return table


def pairs_with_margin(margin, count=61, row=BAD_ROW):
    """Preference pairs (TRL's implicit-prompt layout plus Llama 2's margin) with `margin` at `row` (1-based)."""
    table = [
        {"chosen": f"a kind answer {i}", "rejected": f"a rude answer {i}", "margin": (i % 3) / 2} for i in range(count)
    ]
    table[row - 1]["margin"] = margin
    return table


def cases(tmp_path):
    """(name, --train file, the words of the one line)."""
    numbers = lambda i: float(i % 5) / 4  # noqa: E731  (regression labels)
    lists = lambda i: ["a"] if i % 2 else ["a", "b"]  # noqa: E731  (multi-label labels)
    broken = tmp_path / "broken.jsonl"
    lines = [json.dumps(r) for r in labelled("pos")]
    lines[BAD_ROW - 1] = '{"text": "a film", "label": "pos"'  # cut short
    broken.write_text("\n".join(lines) + "\n")
    latin = tmp_path / "latin.csv"
    table = labelled("pos")
    table[BAD_ROW - 1]["text"] = "un film très réussi"
    latin.write_bytes(("text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in table)).encode("latin-1"))
    infinite = tmp_path / "infinite.csv"
    infinite.write_text("text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in labelled("inf", good=numbers)))
    return [
        (
            "empty label",
            write(tmp_path / "empty.jsonl", labelled("")),
            "label 'label' missing or empty in 1 row(s), first at row 31",
        ),
        (
            "blank label",
            write(tmp_path / "blank.jsonl", labelled("  ")),
            "label 'label' missing or empty in 1 row(s), first at row 31",
        ),
        (
            "empty label in a list",
            write(tmp_path / "lists.jsonl", labelled(["a", ""], good=lists)),
            "label 'label' missing or empty in 1 row(s), first at row 31",
        ),
        ("infinite label (CSV)", infinite, "label 'label' not finite in 1 row(s), first at row 31"),
        (
            "infinite label (JSON lines)",
            write(tmp_path / "infinite.jsonl", labelled(float("inf"), good=numbers)),
            "label 'label' not finite in 1 row(s), first at row 31",
        ),
        (
            "infinite margin (preference pairs)",
            write(tmp_path / "pairs.jsonl", pairs_with_margin(float("inf"))),
            "'margin' is not finite in 1 row(s), first at row 31",
        ),
        ("broken JSON line", broken, "line 31 is not JSON"),
        ("Latin-1 CSV", latin, "not UTF-8 text: line 32 (byte"),  # line 32: the header is line 1
    ]


def test_each_bad_row_is_one_line_before_any_model_is_loaded(base, tmp_path, capfd):  # noqa: F811
    for name, data, words in cases(tmp_path):
        output = tmp_path / "out"
        assert run("train", "--model", base, "--train", data, "--output", output) == 2, name
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"stable-models: error: {data}: "), (name, err[-5:])
        assert words in err[0], (name, err[0])
        assert not output.exists(), name


def test_evaluate_and_predict_files_get_the_same_lines(trained, tmp_path, capfd):  # noqa: F811
    """The rules hold for the files evaluate and predict read: the same one line, exit 2, no report or output."""
    model = trained[0]
    by_name = {name: (data, words) for name, data, words in cases(tmp_path)}
    report, output = tmp_path / "report", tmp_path / "p.jsonl"
    runs = [("evaluate", name, ["--report-dir", report]) for name in ("empty label", "blank label")]
    both = (("evaluate", ["--report-dir", report]), ("predict", ["--output", output]))
    runs += [(command, name, extra) for name in ("broken JSON line", "Latin-1 CSV") for command, extra in both]
    for command, name, extra in runs:
        data, words = by_name[name]
        assert run(command, "--model", model, "--data", data, *extra) == 2, (command, name)
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"stable-models: error: {data}: "), (command, name, err[-5:])
        assert words in err[0], (command, name, err[0])
        assert not report.exists() and not output.exists(), (command, name)


def test_the_encoding_named_in_the_error_reads_the_file(base, tmp_path, capfd):  # noqa: F811
    """The fix the Latin-1 error names works: --encoding latin-1 reads the same file, accents intact."""
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\nun film très réussi,pos\nennuyeux à mourir,neg\n".encode("latin-1") * 1)
    assert run("train", "--model", base, "--train", latin, "--output", tmp_path / "out") == 2
    assert "--encoding latin-1" in capfd.readouterr().err
    from stable_models.cli.data import read_table

    assert read_table(latin, "latin-1")["text"] == ["un film très réussi", "ennuyeux à mourir"]


def test_verbose_shows_what_failed_underneath_above_the_one_line(base, tmp_path, capfd):  # noqa: F811
    """--verbose brings back what the one line replaced: the reader's own traceback (datasets wrapping pandas'
    UnicodeDecodeError for a Latin-1 CSV) above the same one line. A refusal of our own (an infinite label) has
    nothing underneath: still the one line. Without --verbose, the line alone (the test above)."""
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\nun film très réussi,pos\nennuyeux à mourir,neg\n".encode("latin-1"))
    output = tmp_path / "out"
    assert run("train", "--model", base, "--train", latin, "--output", output, "--verbose") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):", err[:3]
    assert any(line.startswith("UnicodeDecodeError: 'utf-8' codec can't decode") for line in err), err
    assert err[-1].startswith(f"stable-models: error: {latin}: not UTF-8 text: line 2 (byte"), err[-1]
    infinite = write(tmp_path / "infinite.jsonl", labelled(float("inf"), good=lambda i: float(i % 5)))
    assert run("train", "--model", base, "--train", infinite, "--output", output, "--verbose") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stable-models: error: {infinite}: label 'label' not finite"), err
    assert not output.exists()


def test_train_counts_the_rows_it_cuts(base, tmp_path, capfd):  # noqa: F811
    """A text longer than the length used is cut, and train says how many, the longest and the length (it cut in
    silence before); the kept tokens are the tokenizer's own truncation."""
    from transformers import AutoTokenizer

    table = [{"text": r["text"], "label": r["label"]} for r in rows("string", 40)]
    long_text = " ".join(["great film"] * 100)
    table[5]["text"] = long_text
    data = write(tmp_path / "train.jsonl", table)
    fast = ["--max-steps", "1", "--batch-size", "4", "--early-stopping", "0", "--max-length", "16"]
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *fast) == 0
    full = len(AutoTokenizer.from_pretrained(base)(long_text)["input_ids"])
    warning = f"{data}: 1 row(s) longer than 16 tokens were cut to 16 (the longest: {full:,} tokens)"
    assert capfd.readouterr().err.count(warning) == 1
    # evaluate and predict cut to the trained length too (they cut in silence before), and say so once per command
    model = tmp_path / "m"
    for command, extra in (("evaluate", []), ("predict", ["--output", tmp_path / "p.jsonl"])):
        assert run(command, "--model", model, "--data", data, *extra) == 0
        assert capfd.readouterr().err.count(f"[{command}] warning: {warning}") == 1, command
    short = write(tmp_path / "short.jsonl", table[:5])
    assert run("predict", "--model", model, "--data", short, "--output", tmp_path / "q.jsonl") == 0
    assert "were cut" not in capfd.readouterr().err
