"""The cluster tier (`./dev ray-test`, the ray extra): `stable-models predict --engine ray` on a local Ray cluster of 4
CPUs and 512 MB of object store, two scoring actors of one CPU each. For every task its rows equal one process's
`predict` within 1e-5 (relative, for scores over 1). A worker killed with a block written under its temporary name,
and a driver killed after two blocks and run again, leave every input row in the output exactly once. No Ray process
outlives the module."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from consumer_rows import BY_ROW, QUERY, TEXTS, build, embedder_row
from documented import PAGES, blocks, commands

ray = pytest.importorskip("ray")

from stable_models import cli  # noqa: E402
from stable_models.cli.ray_predict import Predictor  # noqa: E402

TOLERANCE = 1e-5
RAY = ["--engine", "ray", "--actors", "2", "--block-rows", "3"]
TEXT_ROWS = [{"id": f"t{i}", "text": f"{TEXTS[i % len(TEXTS)]} {i}"} for i in range(14)]


@pytest.fixture(scope="module")
def cluster():
    """A local cluster for the module; its address lets a separate driver process join it."""
    ray.init(num_cpus=4, object_store_memory=512 * 2**20, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        deadline = time.time() + 30
        while ray_processes() and time.time() < deadline:
            time.sleep(0.5)
        assert not ray_processes(), ray_processes()


def ray_processes() -> list[str]:
    found = subprocess.run(["pgrep", "-af", "raylet|gcs_server|ray::"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    for name in ("classifier", "reward model", "reranker, pair"):
        build(BY_ROW[name], root / name)
    embedder_row(root)
    return root


def write_shards(folder: Path, rows: list[dict]) -> Path:
    """The rows in two shards, JSON lines and Parquet (the second holds the larger share)."""
    folder.mkdir(parents=True, exist_ok=True)
    cut = len(rows) // 3
    (folder / "part-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:cut]))
    pq.write_table(pa.Table.from_pylist(rows[cut:]), folder / "part-b.parquet")
    return folder


def one_process(folder, rows, tmp_path, *extra) -> list[dict]:
    data, out = tmp_path / "all.jsonl", tmp_path / "all-predicted.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["predict", "--model", str(folder), "--data", str(data), "--output", str(out), *extra]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def ray_rows(output: Path) -> list[dict]:
    return [row for path in sorted(output.glob("*.parquet")) for row in pq.read_table(path).to_pylist()]


def input_index(row, rows_in_first_shard: int) -> int:
    return row["row"] + (rows_in_first_shard if row["shard"] == "part-b.parquet" else 0)


def close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):  # fp32: 1e-5 of the value where it is over 1 (a block packs a group's documents
        return abs(a - b) <= TOLERANCE * max(1.0, abs(b))  # with other groups than the whole file does)
    return a == b


CASES = {  # task: (folder, input rows, the fields compared)
    "classifier": ("classifier", TEXT_ROWS, ("text", "label", "probabilities")),
    "reward model": ("reward model", TEXT_ROWS, ("text", "reward")),
    "reranker, pointwise rows": (
        "reranker, pair",
        [{"query": f"{QUERY} {i % 3}", "document": r["text"]} for i, r in enumerate(TEXT_ROWS)],
        ("query", "document", "score"),
    ),
    "reranker, query groups": (
        "reranker, pair",
        [
            {"query": f"{QUERY} {i}", "pos": [TEXTS[i % 5]], "neg": [TEXTS[(i + 1) % 5], TEXTS[(i + 2) % 5]]}
            for i in range(9)
        ],
        ("query", "document", "score", "rank"),
    ),
    "embedder": ("embedder", TEXT_ROWS, ("text", "embedding")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_tasks_rows_are_one_process_predicts(case, cluster, folders, tmp_path, capfd):
    name, rows, fields = CASES[case]
    expected = one_process(folders / name, rows, tmp_path)
    data = write_shards(tmp_path / "in", rows)
    output = tmp_path / "out"
    assert (
        cli.main(["predict", "--model", str(folders / name), "--data", str(data), "--output", str(output), *RAY]) == 0
    )
    got = ray_rows(output)
    assert len(got) == len(expected) and json.loads((output / "_SUCCESS.json").read_text())["rows"] == len(rows)
    first = len(rows) // 3
    if "group" in expected[0]:  # a row per document: matched by the group's input row and the document
        keyed = {(r["group"] - 1, r["document"]): r for r in expected}
        pairs = [(r, keyed[(input_index(r, first), r["document"])]) for r in got]
    else:
        pairs = [(r, expected[input_index(r, first)]) for r in got]
    for ours, theirs in pairs:
        assert all(close(theirs[k], ours[k]) for k in fields), (ours, theirs)
        assert ours.get("id") == rows[input_index(ours, first)].get("id")  # the input's id, where it has one
    said = capfd.readouterr().err
    if case == "reranker, pointwise rows":  # a query's rows may lie in several blocks: no rank, and the run says so
        assert "rank" not in got[0] and "[predict] no rank field" in said
    else:
        assert "no rank field" not in said


def test_rows_longer_than_the_model_are_cut_as_predict_cuts_them_and_counted(cluster, tmp_path, capfd):
    build(BY_ROW["classifier"], tmp_path / "short", max_length=64)  # the saved tokenizer cuts at 64 tokens
    rows = [{"id": f"t{i}", "text": "the plot was dull " * (40 if i in (2, 9) else 1)} for i in range(12)]
    expected = one_process(tmp_path / "short", rows, tmp_path)
    output = tmp_path / "out"
    argv = ["predict", "--model", str(tmp_path / "short"), "--data", str(write_shards(tmp_path / "in", rows))]
    capfd.readouterr()
    assert cli.main([*argv, "--output", str(output), *RAY]) == 0
    assert json.loads((output / "_SUCCESS.json").read_text())["cut_now"] == 2
    assert "2 row(s) longer than the model's limit were cut" in capfd.readouterr().err
    for ours in ray_rows(output):
        assert close(expected[input_index(ours, len(rows) // 3)]["probabilities"], ours["probabilities"])


def complete(output: Path, count: int) -> None:
    rows = ray_rows(output)
    keys = [(r["shard"], r["row"]) for r in rows]
    assert len(keys) == count and len(set(keys)) == count, (len(keys), len(set(keys)))
    assert sorted({r["id"] for r in rows}) == sorted(r["id"] for r in TEXT_ROWS)
    assert not list(output.glob(".*.tmp"))


def test_a_worker_killed_mid_block_leaves_no_row_lost_or_twice(cluster, folders, tmp_path, monkeypatch):
    data = write_shards(tmp_path / "in", TEXT_ROWS)
    marker = tmp_path / "crashed"
    monkeypatch.setenv("STABLE_MODELS_RAY_CRASH_BLOCK", "part-b-000000000002.parquet")
    monkeypatch.setenv("STABLE_MODELS_RAY_CRASH_MARKER", str(marker))
    output = tmp_path / "out"
    argv = ["predict", "--model", str(folders / "classifier"), "--data", str(data), "--output", str(output), *RAY]
    assert cli.main([*argv, "--block-rows", "2"]) == 0
    assert marker.is_file()  # the actor died once, that block's rows in its temporary file, not yet renamed
    complete(output, len(TEXT_ROWS))


def test_a_killed_driver_run_again_resumes_from_what_is_written(cluster, folders, tmp_path, capfd):
    """The driver killed (its own process, after two blocks came back) while one actor works through 14 blocks;
    the command run again scores only what is missing."""
    data = write_shards(tmp_path / "in", TEXT_ROWS)
    output = tmp_path / "out"
    argv = ["predict", "--model", str(folders / "embedder"), "--data", str(data), "--output", str(output), *RAY]
    argv += ["--ray-address", cluster, "--actors", "1", "--block-rows", "1"]
    env = dict(os.environ, STABLE_MODELS_RAY_DRIVER_EXIT_AFTER="2", RAY_USAGE_STATS_ENABLED="0")
    killed = subprocess.run([sys.executable, "-m", "stable_models", *argv], env=env, capture_output=True, text=True)
    assert killed.returncode == 3, killed.stderr[-2000:]
    written = len(list(output.glob("*.parquet")))
    assert written >= 2 and not (output / "_SUCCESS.json").exists()
    capfd.readouterr()
    assert cli.main(argv) == 0
    assert f"{written} already written" in capfd.readouterr().err
    complete(output, len(TEXT_ROWS))
    assert json.loads((output / "_SUCCESS.json").read_text())["scored_now"] == len(TEXT_ROWS) - written
    assert cli.main(argv) == 2  # a finished run is not scored again by accident
    assert "is a finished run" in capfd.readouterr().err


def test_a_rerun_scores_only_the_missing_blocks_and_leaves_the_written_ones(cluster, folders, tmp_path, capfd):
    """Deterministic resume: of a finished run, two blocks' files removed, a killed worker's temporary file left and
    the completion marker gone; the run again writes those two blocks only and touches no other file."""
    data = write_shards(tmp_path / "in", TEXT_ROWS)
    output = tmp_path / "out"
    argv = ["predict", "--model", str(folders / "classifier"), "--data", str(data), "--output", str(output), *RAY]
    assert cli.main(argv) == 0
    files = sorted(output.glob("*.parquet"))
    removed = [files[1], files[-1]]
    for path in removed:
        path.unlink()
    (output / "_SUCCESS.json").unlink()
    (output / f".{removed[0].name}.123.tmp").write_bytes(b"half a file")
    kept = {p.name: p.stat().st_mtime_ns for p in output.glob("*.parquet")}
    capfd.readouterr()
    assert cli.main(argv) == 0
    assert f"{len(files) - 2} already written" in capfd.readouterr().err
    assert all(p.stat().st_mtime_ns == kept[p.name] for p in output.glob("*.parquet") if p.name in kept)
    rows_of_removed = sum(pq.read_metadata(p).num_rows for p in removed)
    assert json.loads((output / "_SUCCESS.json").read_text())["scored_now"] == rows_of_removed
    complete(output, len(TEXT_ROWS))


def test_what_the_ray_engine_cannot_do_is_refused_in_one_line(cluster, folders, tmp_path, capsys):
    data = write_shards(tmp_path / "in", TEXT_ROWS)
    model = str(folders / "reranker, pair")
    groups = write_shards(tmp_path / "groups", CASES["reranker, query groups"][1])
    base = ["predict", "--model", model, "--engine", "ray"]
    assert cli.main([*base, "--data", str(groups), "--output", str(tmp_path / "o"), "--top-k", "1"]) == 2
    assert "--top-k needs whole groups" in capsys.readouterr().err
    assert cli.main([*base, "--data", str(data), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "writes a folder of Parquet shards" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    assert cli.main([*base, "--data", str(groups), "--output", str(other)]) == 2
    assert "holds files that no run wrote (mine.txt" in capsys.readouterr().err
    assert cli.main([*base, "--data", str(groups), "--output", str(other), "--overwrite"]) == 2
    assert "holds files that no run wrote" in capsys.readouterr().err and (other / "mine.txt").read_text() == "keep"
    assert cli.main([*base, "--data", str(groups), "--output", str(tmp_path / "run")]) == 0
    assert cli.main([*base, "--data", str(data), "--output", str(tmp_path / "run")]) == 2  # other data, same folder
    assert "holds another run's files" in capsys.readouterr().err
    assert cli.main([*base, "--data", str(tmp_path / "nothing-*.parquet"), "--output", str(tmp_path / "o")]) == 2
    assert "no .parquet or .jsonl files" in capsys.readouterr().err
    bad = write_shards(tmp_path / "bad", [{"text": t} for t in ["fine", "also fine", "", "more", "text", "last"]])
    argv = ["predict", "--model", str(folders / "classifier"), "--data", str(bad), "--output", str(tmp_path / "b")]
    assert cli.main([*argv, *RAY]) == 2  # a bad row stops the run with the task's one line, naming shard and row
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "part-b.parquet (its rows from 1): text missing or empty in 1 row(s), first at row 1" in err, err


def test_the_public_udf_in_a_users_own_pipeline(cluster, folders, tmp_path):
    """Predictor as Ray Data's class UDF: read_parquet -> map_batches -> rows, as one process's predict gives them."""
    rows = TEXT_ROWS
    expected = one_process(folders / "embedder", rows, tmp_path)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "texts.parquet")
    dataset = ray.data.read_parquet(str(tmp_path / "texts.parquet"))
    scored = dataset.map_batches(
        Predictor,
        fn_constructor_kwargs={"model": str(folders / "embedder"), "text_key": "text"},
        batch_format="pyarrow",
        batch_size=4,
        concurrency=1,
    )
    got = sorted(scored.take_all(), key=lambda r: int(r["id"][1:]))  # the input's ids come through
    assert [r["id"] for r in got] == [r["id"] for r in rows] and [r["text"] for r in got] == [r["text"] for r in rows]
    vectors = torch.tensor([list(r["embedding"]) for r in got]), torch.tensor([r["embedding"] for r in expected])
    assert (vectors[0] - vectors[1]).abs().max() <= TOLERANCE


RAY_BLOCKS = [block for block in blocks("python") if "import ray\n" in block]  # the default tier runs the others


@pytest.mark.parametrize("index", range(len(RAY_BLOCKS)))
def test_the_documented_ray_snippets_run(index, cluster, folders, tmp_path):
    """docs/ray.md's pipeline, with its names given: it writes the rows predict gives."""
    pq.write_table(pa.Table.from_pylist(TEXT_ROWS), tmp_path / "texts.parquet")
    namespace = {"shards": str(tmp_path / "texts.parquet"), "folder": str(folders / "classifier")}
    namespace["output"] = str(tmp_path / "written")
    exec(RAY_BLOCKS[index], namespace)
    written = sorted(pq.read_table(tmp_path / "written").to_pylist(), key=lambda r: int(r["id"][1:]))
    expected = one_process(folders / "classifier", TEXT_ROWS, tmp_path)
    assert [r["label"] for r in written] == [r["label"] for r in expected]
    assert all(close(e["probabilities"], w["probabilities"]) for e, w in zip(expected, written, strict=True))


def test_there_are_ray_snippets():
    assert RAY_BLOCKS


@pytest.mark.parametrize("page", ["README.md", "docs/ray.md"])
def test_the_documented_command_runs_as_written(page, cluster, folders, tmp_path, monkeypatch):
    import shlex

    [line] = commands("--engine ray", [p for p in PAGES if p.as_posix().endswith(page)])
    monkeypatch.chdir(tmp_path)
    write_shards(tmp_path / "shards", TEXT_ROWS)
    argv = shlex.split(line.replace("./clf", str(folders / "classifier")))[1:]
    assert cli.main(argv) == 0
    complete(tmp_path / "scored", len(TEXT_ROWS))
