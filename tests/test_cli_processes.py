"""`stable-models train / evaluate / predict` as one job over two processes (torchrun, gloo, CPU): one writer, the
loss history and the outputs of one process, DeepSpeed ZeRO-3 saving a whole model, and a second run into the same
--output refused while the first holds it."""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest
import torch
from distributed import failure_output
from safetensors.torch import load_file
from test_cli import rows, write
from test_doctor import save_checkpoint
from tiny_tokenizers import qwen2_like

from stable_models import cli

pytest.importorskip("datasets")

EXHAUSTIVE = pytest.mark.exhaustive
STEPS = ["--max-steps", "4", "--eval-steps", "2", "--lr", "5e-3", "--early-stopping", "0", "--dtype", "fp32"]


def launch(*args, processes=2, env=None, check=True):
    """`stable-models ARGS` under torchrun with `processes` ranks (the console entry point, as a user runs it)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    command += ["-m", "stable_models", *map(str, args)]
    # PYTHONFAULTHANDLER: a rank that aborts (SIGABRT) prints every thread's Python stack, so a rare crash says where
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONFAULTHANDLER": "1"}
    environment.update(env or {})
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{failure_output(done)}"
    return done


def train_losses(folder):
    log = json.loads((folder / "training_log.json").read_text())
    return [entry["loss"] for entry in log if "loss" in entry and "train_runtime" not in entry]


def readme_torchrun_lines() -> list[list[str]]:
    """The documented torchrun commands (train, predict: docs/scale.md), as argument lists after `-m stable_models`."""
    from documented import blocks

    block = next(b for b in blocks("bash") if "torchrun" in b)
    lines = [shlex.split(line) for line in block.splitlines() if line.startswith("torchrun ")]
    assert [line[:5] for line in lines] == [["torchrun", "--nproc_per_node", "2", "-m", "stable_models"]] * 2
    return [line[5:] for line in lines]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny base checkpoint and a training file, for the tests that launch no torchrun job."""
    folder = tmp_path_factory.mktemp("files")
    return save_checkpoint(folder / "base", "qwen2", qwen2_like()), write(folder / "train.jsonl", rows("string", 64))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The README's torchrun train (two processes, batch 4), and the same run as one process with batch 8."""
    folder = tmp_path_factory.mktemp("processes")
    base = save_checkpoint(folder / "base", "qwen2", qwen2_like())
    data = write(folder / "train.jsonl", rows("string", 64))
    held_out = write(folder / "eval.jsonl", rows("string", 90)[64:])
    readme_train = readme_torchrun_lines()[0]
    paths = {"./SmolLM2-135M-Instruct": base, "reviews.csv": data, "./clf": folder / "two"}
    two = launch(*[paths.get(a, a) for a in readme_train], "--eval", held_out, *STEPS, "--batch-size", "4")
    common = ["train", "--model", base, "--train", data, "--eval", held_out, *STEPS]
    assert cli.main([str(a) for a in common + ["--batch-size", "8", "--output", folder / "one"]]) == 0
    return folder, base, data, held_out, two


@EXHAUSTIVE  # a torchrun job: the default run keeps one multi-process case per mechanism (test_ddp.py)
def test_two_processes_train_like_one_with_the_doubled_batch_and_write_once(job):
    folder, _, _, _, two = job
    assert train_losses(folder / "two") == pytest.approx(train_losses(folder / "one"), rel=1e-5)
    assert len(train_losses(folder / "two")) == 4
    assert two.stdout.count("[train] done") == 1 and two.stderr.count("pre-flight ok") == 1  # rank 0 alone reports
    assert "find_unused_parameters=True" not in two.stderr  # no extra autograd walk per step: nothing is unused
    one, both = load_file(folder / "one" / "model.safetensors"), load_file(folder / "two" / "model.safetensors")
    assert one.keys() == both.keys() and all(torch.allclose(one[k], both[k], atol=1e-5) for k in one)
    assert not (folder / "two" / ".stable-models.lock").exists()


@EXHAUSTIVE  # a torchrun job: the default run keeps one multi-process case per mechanism (test_ddp.py)
def test_predict_and_evaluate_on_two_processes_equal_one(job, tmp_path):
    folder, _, _, held_out, _ = job
    model = folder / "one"
    readme_predict = readme_torchrun_lines()[1]  # as the README writes it, with this test's files
    for suffix in (".jsonl", ".csv"):
        paths = {"./clf": model, "new.csv": held_out, "scores.jsonl": tmp_path / f"two{suffix}"}
        launch(*[paths.get(a, a) for a in readme_predict])
        assert (
            cli.main(
                ["predict", "--model", str(model), "--data", str(held_out), "--output", str(tmp_path / f"one{suffix}")]
            )
            == 0
        )
        assert not list(tmp_path.glob("*.part"))
    one = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert [r["text"] for r in two] == [r["text"] for r in one] == [r["text"] for r in rows("string", 90)[64:]]
    assert [r["label"] for r in two] == [r["label"] for r in one]
    probs = torch.tensor([list(r["probabilities"].values()) for r in one])
    assert (torch.tensor([list(r["probabilities"].values()) for r in two]) - probs).abs().max() <= 1e-5
    csv_one, csv_two = (tmp_path / "one.csv").read_text().splitlines(), (tmp_path / "two.csv").read_text().splitlines()
    assert len(csv_two) == len(csv_one) == 27 and csv_two[0] == csv_one[0] == "text,label,score,p_neg,p_pos"

    reports = {}
    for name, processes in (("one", 1), ("two", 2)):
        args = ["evaluate", "--model", model, "--data", held_out, "--report-dir", tmp_path / name]
        if processes == 1:
            assert cli.main([str(a) for a in args]) == 0
        else:
            assert launch(*args).stdout.count("report:") == 1
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    assert reports["two"]["examples"] == reports["one"]["examples"] == 26
    for key in ("accuracy", "f1_macro", "ece", "roc_auc"):
        assert reports["two"][key] == pytest.approx(reports["one"][key], abs=1e-6), key
    assert reports["two"]["confusion_matrix"] == reports["one"]["confusion_matrix"]


ENDING = """
import atexit, sys
from stable_models.cli import run
atexit.register(lambda: print("exit functions ran"))
class Teardown:
    def __del__(self):
        print("interpreter teardown ran")
teardown = Teardown()
sys.argv = ["stable-models", *sys.argv[1:]]
run()
"""


@pytest.mark.parametrize("world", ["1", "2"])
@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["verify", "missing-folder"], 2, "missing-folder: no such folder"),
        (["--typo"], 2, "usage:"),
        ([], 2, "usage:"),
        (["--help"], 0, "usage:"),
    ],
)
def test_a_command_ends_after_its_exit_functions_without_the_interpreters_teardown(world, argv, code, said):
    """The command, alone or one of many ranks (WORLD_SIZE > 1), runs the exit functions (trackers, logs) and keeps
    its exit code and output, but skips the interpreter's teardown: 1.4 s of each command, and where gloo's threads
    aborted finished ranks."""
    done = subprocess.run(
        [sys.executable, "-c", ENDING, *argv], env={**os.environ, "WORLD_SIZE": world}, capture_output=True, text=True
    )
    assert done.returncode == code, done.stderr[-2000:]
    assert "exit functions ran" in done.stdout
    assert "interpreter teardown ran" not in done.stdout
    assert said in done.stdout + done.stderr


INTERRUPTED = """
import stable_models.cli as cli
def interrupted():
    raise KeyboardInterrupt
cli.main = interrupted
cli.run()
"""


def test_a_command_stopped_by_ctrl_c_exits_130():
    done = subprocess.run([sys.executable, "-c", INTERRUPTED], capture_output=True, text=True)
    assert done.returncode == 130 and "KeyboardInterrupt" in done.stderr, done.stderr[-2000:]


def test_a_second_train_into_a_running_jobs_output_is_refused(files, tmp_path):
    base, data = files
    output = tmp_path / "busy"
    command = [sys.executable, "-m", "stable_models", "train", "--model", base, "--train", data, "--output", output]
    first = subprocess.Popen(
        # a run that cannot end before it is killed, however slow the second one is to start on a busy machine
        [*map(str, command), "--max-steps", "1000000", "--eval-steps", "1000000", "--batch-size", "2"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if (output / ".stable-models.lock").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None, "the first run ended before it could be raced"
        second = subprocess.run(
            [*map(str, command), "--overwrite", "--max-steps", "1"], capture_output=True, text=True, timeout=300
        )
        assert first.poll() is None, "the first run ended while the second started: the race was not run"
        assert second.returncode == 2, second.stderr[-3000:]
        last = second.stderr.strip().splitlines()[-1]
        assert "is being written by another stable-models train (pid" in last and str(first.pid) in last, last
    finally:
        first.kill()
        first.wait()
    assert not (output / "model.safetensors").exists()  # nothing of the refused run was written


@EXHAUSTIVE
@pytest.mark.parametrize("mode", ["--full", "lora"])
def test_deepspeed_zero3_saves_the_whole_model(job, tmp_path, mode):
    folder, base, data, held_out, _ = job
    output = tmp_path / "zero3"
    done = launch(
        "train",
        "--model",
        base,
        "--train",
        data,
        "--eval",
        held_out,
        *STEPS,
        "--batch-size",
        "4",
        *([mode] if mode == "--full" else []),
        "--deepspeed",
        "zero3",
        "--output",
        output,
        env={"DS_ACCELERATOR": "cpu"},
    )
    assert "pre-flight skipped: ZeRO-3" in done.stderr
    saved = load_file(output / "model.safetensors")
    reference = load_file(folder / "one" / "model.safetensors")
    assert saved.keys() == reference.keys()  # LoRA merged: no adapter tensors
    assert all(saved[k].shape == reference[k].shape and saved[k].numel() > 0 for k in saved)  # no 0-element slices
    base_weights = load_file(base / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(saved[name], base_weights[name])  # the trained change is in the saved weights
    job_metrics = json.loads((output / "eval_metrics.json").read_text())  # measured by the ZeRO-3 model, in the job
    args = ["evaluate", "--model", str(output), "--data", str(held_out), "--report-dir", str(tmp_path / "r")]
    assert cli.main(args) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())  # the saved folder, loaded alone
    for key in ("accuracy", "f1_macro", "ece", "roc_auc"):
        assert report[key] == pytest.approx(job_metrics[key], abs=1e-6), key


def test_fsdp_on_cpu_says_it_needs_gpus(files, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: --fsdp runs")
    base, data = files
    args = ["train", "--model", base, "--train", data, "--output", tmp_path / "f", "--fsdp"]
    assert cli.main([str(a) for a in args]) == 2
    assert "--fsdp needs GPUs" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


@EXHAUSTIVE  # a torchrun job: the default run keeps one multi-process case per mechanism (test_ddp.py)
def test_bad_input_stops_every_rank_with_one_line(job, tmp_path):
    """A check that fails on rank 0 stops the job with exit code 2, and the error prints once, not once per rank."""
    folder, base, data, _, _ = job
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    done = launch("train", "--model", base, "--train", empty, "--output", tmp_path / "o", check=False)
    assert done.returncode != 0
    assert done.stderr.count("stable-models: error:") == 1 and f"{empty} is empty" in done.stderr
    assert "exitcode  : 2" in done.stderr  # torchrun's failure report: exit code 2, the one-line error's
    assert not (tmp_path / "o").exists()


@EXHAUSTIVE  # a torchrun job: the default run keeps one multi-process case per mechanism (test_ddp.py)
def test_a_reward_model_trains_and_evaluates_on_two_processes_like_one(tmp_path):
    """Preference pairs (margins, centering) under torchrun, fully fine-tuned: the loss history of one process with
    the doubled batch, one report, the same pairwise metrics; DDP does not look for unused parameters."""
    from test_reward_cli import chat_tokenizer, pairs

    base = save_checkpoint(tmp_path / "base", "qwen2", chat_tokenizer())
    rows = pairs("conversational-explicit", 40)
    for i, row in enumerate(rows):
        row["margin"] = (i % 4) / 3
    rows[0]["rejected"] = rows[0]["chosen"]  # one identical pair: warned about once, by rank 0
    data, held_out = write(tmp_path / "train.jsonl", rows[:32]), write(tmp_path / "eval.jsonl", rows[32:])
    common = ["train", "--model", base, "--train", data, "--eval", held_out, *STEPS, "--center-rewards", "0.01"]
    common += ["--full"]
    trained = launch(*common, "--batch-size", "4", "--output", tmp_path / "two")
    assert trained.stderr.count("chosen equals rejected in 1 pair(s)") == 1
    assert "find_unused_parameters=True" not in trained.stderr
    assert cli.main([str(a) for a in common + ["--batch-size", "8", "--output", tmp_path / "one"]]) == 0
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)
    assert len(train_losses(tmp_path / "two")) == 4
    evaluation = launch("evaluate", "--model", tmp_path / "two", "--data", held_out, "--report-dir", tmp_path / "r2")
    assert evaluation.stdout.count("preference pairs, 8") == 1
    assert (
        cli.main(
            [
                "evaluate",
                "--model",
                str(tmp_path / "two"),
                "--data",
                str(held_out),
                "--report-dir",
                str(tmp_path / "r1"),
            ]
        )
        == 0
    )
    two, one = (json.loads((tmp_path / r / "report.json").read_text()) for r in ("r2", "r1"))
    assert two["accuracy"] == one["accuracy"] and two["margin_mean"] == pytest.approx(one["margin_mean"], abs=1e-6)


@EXHAUSTIVE  # three torchrun jobs: the default run keeps one multi-process case per mechanism (test_ddp.py)
def test_a_reranker_trains_evaluates_and_predicts_on_two_processes_like_one(tmp_path):
    """Query groups of 3 to 5 documents under torchrun: each micro-batch holds whole groups, the loss divides by the
    groups of all processes, so the history equals one process with the doubled batch; evaluate and predict equal a
    one-process run."""
    from test_ranking_cli import groups, layout_rows

    base = save_checkpoint(tmp_path / "base", "qwen2", qwen2_like(), use_sliding_window=False)  # shares prefixes
    data = write(tmp_path / "train.jsonl", layout_rows("flag", groups(16)))
    held_out = write(tmp_path / "eval.jsonl", layout_rows("flag", groups(21)[16:]))
    common = ["train", "--model", base, "--train", data, "--eval", held_out, *STEPS]
    launch(*common, "--batch-size", "2", "--output", tmp_path / "two")
    assert cli.main([str(a) for a in common + ["--batch-size", "4", "--output", tmp_path / "one"]]) == 0
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)
    assert len(train_losses(tmp_path / "two")) == 4
    evaluation = launch("evaluate", "--model", tmp_path / "two", "--data", held_out, "--report-dir", tmp_path / "r2")
    assert evaluation.stdout.count("reranking, 5 queries") == 1
    assert (
        cli.main(
            [
                "evaluate",
                "--model",
                str(tmp_path / "two"),
                "--data",
                str(held_out),
                "--report-dir",
                str(tmp_path / "r1"),
            ]
        )
        == 0
    )
    two, one = (json.loads((tmp_path / r / "report.json").read_text()) for r in ("r2", "r1"))
    for key in ("ndcg@10", "mrr@10", "map"):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key
    launch("predict", "--model", tmp_path / "two", "--data", held_out, "--output", tmp_path / "p2.jsonl")
    assert (
        cli.main(
            [
                "predict",
                "--model",
                str(tmp_path / "two"),
                "--data",
                str(held_out),
                "--output",
                str(tmp_path / "p1.jsonl"),
            ]
        )
        == 0
    )
    p2, p1 = ([json.loads(line) for line in (tmp_path / p).read_text().splitlines()] for p in ("p2.jsonl", "p1.jsonl"))
    assert [(r["group"], r["document"], r["rank"]) for r in p2] == [(r["group"], r["document"], r["rank"]) for r in p1]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(p2, p1, strict=True)) <= 1e-5


@EXHAUSTIVE  # a torchrun job per command: the default run keeps one multi-process case per mechanism
def test_an_embedder_predicts_and_evaluates_on_two_processes_like_one(tmp_path):
    """Each rank embeds its contiguous shard and rank 0 writes: the vectors, in input order, and the retrieval report
    equal a one-process run's."""
    from consumer_rows import embedder_row
    from test_ranking_cli import groups, layout_rows

    embedder_row(tmp_path)
    model = tmp_path / "embedder"
    texts = write(
        tmp_path / "texts.jsonl", [{"text": f"review {i}: {'great' if i % 3 else 'dull'}"} for i in range(23)]
    )
    launch("predict", "--model", model, "--data", texts, "--output", tmp_path / "p2.jsonl")
    assert (
        cli.main(["predict", "--model", str(model), "--data", str(texts), "--output", str(tmp_path / "p1.jsonl")]) == 0
    )
    p2, p1 = ([json.loads(line) for line in (tmp_path / p).read_text().splitlines()] for p in ("p2.jsonl", "p1.jsonl"))
    assert [r["text"] for r in p2] == [r["text"] for r in p1]
    assert (torch.tensor([r["embedding"] for r in p2]) - torch.tensor([r["embedding"] for r in p1])).abs().max() < 1e-5
    data = write(tmp_path / "groups.jsonl", layout_rows("flag", groups(12)))
    launch("evaluate", "--model", model, "--data", data, "--report-dir", tmp_path / "r2")
    assert cli.main(["evaluate", "--model", str(model), "--data", str(data), "--report-dir", str(tmp_path / "r1")]) == 0
    two, one = (json.loads((tmp_path / r / "report.json").read_text()) for r in ("r2", "r1"))
    for key in ("ndcg@10", "mrr@10", "recall@10"):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key
