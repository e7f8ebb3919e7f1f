"""A task declares the options it reads (`Task.reads`); any other option that only some task reads is refused with
one line and exit 2, in one place for every command (`tasks.refuse_unread`). The table is built from the parsers, so
a new flag that no list names fails here."""

import argparse
import json
from types import SimpleNamespace

import pytest

from stable_models import cli
from stable_models.cli import arguments
from stable_models.cli.errors import CliError
from stable_models.cli.tasks import COMMON_OPTIONS, TASKS, refuse_unread, task_named, task_options

COMMANDS = ("train", "evaluate", "predict")


def parser_options(command):
    top = arguments.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {a.dest for a in sub._actions if a.dest != "help"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_the_parsers_is_common_or_read_by_some_task(command):
    options = parser_options(command)
    assert options == COMMON_OPTIONS[command] | task_options(command), (
        "classify each new option: tasks.COMMON_OPTIONS, or the `reads` of the tasks that read it"
    )
    assert not COMMON_OPTIONS[command] & task_options(command)


TABLE = [(c, t, o) for c in COMMANDS for t in TASKS for o in sorted(task_options(c))]


@pytest.mark.parametrize("command, task_name, option", TABLE, ids=["-".join(row) for row in TABLE])
def test_an_option_the_task_does_not_read_is_refused_and_one_it_reads_is_not(command, task_name, option):
    task = task_named(task_name)
    args = SimpleNamespace(given={option, *COMMON_OPTIONS[command]})
    if option in task.reads.get(command, ()):
        refuse_unread(args, task, command)
        return
    flag = "--" + option.replace("_", "-")
    with pytest.raises(CliError, match=f"^{flag} is read for .* in {command}, not for {task.kind}: drop it$"):
        refuse_unread(args, task, command)


def test_given_means_set_by_the_user_whatever_the_value(tmp_path):
    args = arguments.parse(["predict", "--model", "m", "--data", "d", "--output", "o.jsonl", "--text-key", "text"])
    assert args.given == {"model", "data", "output", "text_key"}  # "text" is its default, and it was given
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"batch-size": 8}))
    args = arguments.parse(["predict", "--config", str(config), "--model", "m", "--data", "d", "--output", "o"])
    assert "batch_size" in args.given and "engine" not in args.given


def test_a_named_task_refuses_a_stray_flag_before_any_file_is_opened(tmp_path, capsys):
    """Issue 57: `--task ranking --center-rewards 0.01` on a file whose third line is broken JSON is answered with the
    flag, not the line; so is a flag given at its default value."""
    data = tmp_path / "groups.jsonl"
    good = json.dumps({"query": "q", "pos": ["a"], "neg": ["b"]})
    data.write_text(f"{good}\n{good}\n{{broken\n")
    argv = ["train", "--model", tmp_path / "no-model", "--train", data, "--output", tmp_path / "o", "--task", "ranking"]
    assert cli.main([str(a) for a in argv + ["--center-rewards", "0.01"]]) == 2
    err = capsys.readouterr().err
    assert err.endswith("--center-rewards is read for reward models in train, not for rerankers: drop it\n"), err
    argv[-1] = "classification"
    assert cli.main([str(a) for a in argv + ["--template", "pair"]]) == 2  # "pair" is --template's default
    assert "--template is read for rerankers in train, not for classifiers" in capsys.readouterr().err


def test_task_auto_refuses_a_stray_flag_once_the_columns_name_the_task_before_it_reads_a_row(
    tmp_path, capsys, monkeypatch
):
    from stable_models.cli import ranking

    def must_not_run(*args, **kwargs):
        raise AssertionError("Task.read ran before the flag was refused")

    monkeypatch.setattr(ranking.TASK, "read", must_not_run)
    _, folder = classifier(tmp_path)
    capsys.readouterr()
    data = tmp_path / "groups.jsonl"
    data.write_text(json.dumps({"query": "q", "pos": ["a"], "neg": ["b"]}) + "\n")
    argv = ["train", "--model", folder, "--train", data, "--output", tmp_path / "o", "--center-rewards", "0.01"]
    assert cli.main([str(a) for a in argv]) == 2
    assert "--center-rewards is read for reward models in train, not for rerankers" in capsys.readouterr().err


def classifier(tmp_path):
    from test_doctor import save_checkpoint
    from tiny_tokenizers import qwen2_like

    from stable_models import StableQwen2ForSequenceClassification

    folder = save_checkpoint(tmp_path / "base", "qwen2", qwen2_like())
    model = StableQwen2ForSequenceClassification.from_pretrained(folder, num_labels=2)
    model.config.id2label, model.config.label2id = {0: "bad", 1: "good"}, {"bad": 0, "good": 1}
    model.save_pretrained(tmp_path / "clf")
    qwen2_like().save_pretrained(tmp_path / "clf")
    return folder, tmp_path / "clf"


@pytest.mark.parametrize(
    "extra",
    [["--top-k", "1"], ["--group-key", "text"]],
    ids=["top-k", "group-key"],
)
def test_predict_on_a_classifier_refuses_the_ranking_flags_with_one_line(tmp_path, capsys, extra):
    _, folder = classifier(tmp_path)
    capsys.readouterr()  # saving's progress bars
    data = tmp_path / "new.jsonl"
    data.write_text(json.dumps({"text": "the film was great"}) + "\n")
    argv = ["predict", "--model", folder, "--data", data, "--output", tmp_path / "p.jsonl", *extra]
    assert cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{extra[0]} is read for" in err and "not for classifiers" in err
    assert not (tmp_path / "p.jsonl").exists()


def test_train_of_a_classifier_refuses_corpus_and_group_key(tmp_path, capsys):
    base, _ = classifier(tmp_path)
    capsys.readouterr()
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t, "label": t.split()[-1]}) + "\n" for t in ["it was great", "bad"] * 4)
    )
    argv = ["train", "--model", base, "--train", data, "--output", tmp_path / "out", "--max-steps", "1"]
    for extra in (["--corpus", str(data)], ["--group-key", "text"], ["--template", "qwen3"], ["--loss", "ranknet"]):
        assert cli.main([str(a) for a in argv + extra]) == 2
        err = capsys.readouterr().err
        readers = "rerankers and embedders" if extra[0] == "--corpus" else "rerankers"
        assert err.endswith(f"{extra[0]} is read for {readers} in train, not for classifiers: drop it\n"), err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("task_name", TASKS)
def test_no_task_step_asks_which_command_runs_and_scoring_inputs_are_typed(task_name):
    """A task never branches on the command's name: evaluate and predict have steps of their own, each returning the
    task's own frozen dataclass, not a tuple or a dict whose shape differs by task."""
    import dataclasses
    import inspect
    import typing

    task = task_named(task_name)
    for name, step in inspect.getmembers(task, inspect.ismethod):
        assert "command" not in inspect.signature(step).parameters, f"{task_name}.{name} takes the command's name"
        if name != "options":  # the one step that parses the command line; every other gets its typed options
            assert "args" not in inspect.signature(step).parameters, f"{task_name}.{name} reads the command line again"
    assert dataclasses.is_dataclass(task.Options) and task.Options.__dataclass_params__.frozen
    parsed = task.options(arguments.parse(["predict", "--model", "m", "--data", "d", "--output", "o.jsonl"]))
    assert isinstance(parsed, task.Options) and parsed.data == "d"
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.data = "e"
    for step in (task.evaluation_input, task.prediction_input):
        returned = typing.get_type_hints(step)["return"]
        kinds = typing.get_args(returned) or (returned,)
        assert all(dataclasses.is_dataclass(k) and k.__dataclass_params__.frozen for k in kinds), (task_name, kinds)
