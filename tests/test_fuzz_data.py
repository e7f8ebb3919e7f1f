"""A fuzzed data path: valid files of every format and task, randomly corrupted (cells, dropped, renamed and duplicated
columns, truncated files, bad bytes, empty files), read and checked as `train` reads them. Each run ends one of two
ways: the data is accepted and every label name is a real one, or one `CliError` line naming the file. Never another
exception (a traceback). The default run takes a sample; `-m exhaustive` searches more."""

import gzip
import hashlib
import io
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import base  # noqa: F401  (the module's tiny Qwen2 checkpoint)

from stable_models import cli
from stable_models.cli.commands import read_training_data
from stable_models.cli.errors import CliError

pandas = pytest.importorskip("pandas")
pytest.importorskip("datasets")

WORDS = ["good", "bad", "plot", "actor", "dull", "great"]


def valid_rows(task: str, count: int = 12) -> list[dict]:
    """A valid table of `task`, `count` rows (query groups: one row each)."""
    out = []
    for i in range(count):
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 3))
        out.append(
            {
                "single": {"text": text, "label": ["neg", "pos"][i % 2]},
                "multi": {"text": text, "label": [["a"], ["a", "b"], ["b"]][i % 3]},
                "regression": {"text": text, "label": (i % 4) / 3},
                "pairs": {"prompt": f"q{i}", "chosen": text + " yes", "rejected": text + " no", "margin": i % 3},
                "groups": {"query": f"q{i}", "pos": [text], "neg": [text + " no", "other"]},
            }[task]
        )
    return out


CELL_VALUES = [None, "", "   ", math.nan, math.inf, -math.inf, 7, 2.5, True, [], ["x", ""], {"a": 1}, "x" * 5000]


@st.composite
def corrupted_files(draw):
    task = draw(st.sampled_from(["single", "multi", "regression", "pairs", "groups"]))
    fmt = draw(st.sampled_from([".csv", ".tsv", ".jsonl", ".json", ".parquet", ".jsonl.gz"]))
    rows = valid_rows(task)
    columns = list(rows[0])
    corruption = draw(
        st.sampled_from(
            ["cell", "cell", "cell", "drop column", "rename column", "duplicate column", "truncate"]
            + ["bad bytes", "empty"]
        )
    )
    if corruption == "cell":
        row, column = draw(st.integers(0, len(rows) - 1)), draw(st.sampled_from(columns))
        rows[row][column] = draw(st.sampled_from(CELL_VALUES))
    elif corruption == "drop column":
        gone = draw(st.sampled_from(columns))
        rows = [{k: v for k, v in r.items() if k != gone} for r in rows]
    elif corruption == "rename column":
        old = draw(st.sampled_from(columns))
        rows = [{(k + "_x" if k == old else k): v for k, v in r.items()} for r in rows]
    data = encode(rows, fmt)
    if corruption == "duplicate column" and fmt in (".csv", ".tsv", ".jsonl", ".jsonl.gz"):
        # a second column of the same name: a header naming one twice, or every JSON object holding a key twice
        twice, other = draw(st.sampled_from(columns)), draw(st.sampled_from(columns))
        if fmt in (".csv", ".tsv"):
            header, rest = data.split(b"\n", 1)
            names = header.decode().split("\t" if fmt == ".tsv" else ",")
            names[columns.index(other)] = twice
            data = ("\t" if fmt == ".tsv" else ",").join(names).encode() + b"\n" + rest
        else:
            data = b"".join(
                line.replace(b"{", b'{"' + twice.encode() + b'": ' + json.dumps(r[other]).encode() + b", ", 1) + b"\n"
                for line, r in zip(data.splitlines(), rows, strict=True)
            )
    if corruption == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif corruption == "bad bytes" and fmt != ".parquet":
        at = draw(st.integers(0, max(0, len(data) - 1)))
        data = data[:at] + b"\xff\xfe\x80" + data[at:]
    elif corruption == "empty":
        data = b""
    if fmt.endswith(".gz"):
        data = gzip.compress(data)
    return task, fmt, corruption, data


def encode(rows, fmt) -> bytes:
    if fmt in (".jsonl", ".jsonl.gz"):
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    if fmt == ".json":
        return json.dumps(rows).encode()
    frame = pandas.DataFrame(rows)
    if fmt == ".parquet":
        buffer = io.BytesIO()
        try:
            frame.to_parquet(buffer)
        except Exception:  # a column pyarrow cannot hold (mixed kinds): the file stays empty, an empty file
            return b""
        return buffer.getvalue()
    return frame.to_csv(index=False, sep="\t" if fmt == ".tsv" else ",").encode()


def read_as_train_does(tmp_path, case):
    task, fmt, corruption, data = case
    path = tmp_path / f"{hashlib.sha256(data).hexdigest()[:16]}-{task}{fmt}"  # a new name: datasets caches by path
    path.write_bytes(data)
    args = cli.parse(["train", "--model", "m", "--train", str(path), "--output", str(tmp_path / "out")])
    try:
        training = read_training_data(args, lambda *a, **k: None)
    except CliError as error:
        message = str(error)
        assert message and "\n" not in message and str(path) in message, (case[:3], message)
        return
    for name in training.names:
        assert isinstance(name, str) and name.strip(), (case[:3], training.names)


def fuzz(examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=corrupted_files())
    def run(tmp_path, case):
        read_as_train_does(tmp_path, case)

    return run


test_a_corrupted_file_is_accepted_or_one_line = fuzz(40)
test_a_corrupted_file_is_accepted_or_one_line_searched = pytest.mark.exhaustive(fuzz(400))


def train_on(base, tmp_path, capfd, case):  # noqa: F811  (the fixture)
    """The whole `train` command on a corrupted file: exit 0 and a model whose label names are real, or exit 2, one
    stderr line naming the file and nothing written. Any other end (an exception, a traceback) fails."""
    task, fmt, corruption, data = case
    path = tmp_path / f"{hashlib.sha256(data).hexdigest()[:16]}-{task}{fmt}"
    path.write_bytes(data)
    output = tmp_path / f"out-{path.stem}"
    capfd.readouterr()
    fast = ["--max-steps", "1", "--batch-size", "4", "--early-stopping", "0", "--eval-fraction", "0.25"]
    code = cli.main(["train", "--model", str(base), "--train", str(path), "--output", str(output), *fast])
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("stable-models: error")]
    if code == 2:
        assert len(err) == 1 and str(path) in err[0] and not output.exists(), (case[:3], err)
        return
    assert code == 0 and not err, (case[:3], code, err)
    config = json.loads((output / "config.json").read_text())
    assert all(str(name).strip() for name in config["id2label"].values()), (case[:3], config["id2label"])


def fuzz_train(examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=corrupted_files())
    def run(base, tmp_path, capfd, case):  # noqa: F811
        train_on(base, tmp_path, capfd, case)

    return run


test_train_on_a_corrupted_file_saves_a_model_or_stops_with_one_line = fuzz_train(2)
test_train_on_a_corrupted_file_saves_a_model_or_stops_with_one_line_searched = pytest.mark.exhaustive(fuzz_train(8))
