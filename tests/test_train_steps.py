"""The time around the training steps of `stable-models train`: a pre-flight of about one step on the model as it
will train, evaluation under 15 % of the run and never twice on the same checkpoint, a finished folder without its
checkpoints."""

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from test_cli import FAST, base, rows, run, write  # noqa: F401  (base: the module's tiny Qwen2 checkpoint)
from tiny_tokenizers import qwen2_like
from transformers import AutoTokenizer, Trainer

import stable_models
from stable_models.cli import preflight
from stable_models.cli.fine_tuning import EVAL_SHARE, evaluation_cadence, with_adapters
from stable_models.model_kinds import PREFLIGHT_EXAMPLES, SEQUENCE_CLASSIFIER

datasets = pytest.importorskip("datasets")


class Regressor(torch.nn.Module):
    """A one-weight model with a transformers-style output: the mean of its real tokens' ids, optionally leaking the
    padding side into the logits or ignoring num_items_in_batch, as a broken model would."""

    def __init__(self, leak=False, honours=True, weight=1.0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(weight))
        self.leak, self.honours = leak, honours

    def forward(self, input_ids, attention_mask, labels=None, num_items_in_batch=None):
        logits = (input_ids.float() * attention_mask).sum(-1, keepdim=True) / attention_mask.sum(-1, keepdim=True)
        logits = logits * self.weight / 1000 + (attention_mask[:, :1] if self.leak else 0)
        count = num_items_in_batch if (self.honours and num_items_in_batch) else labels.numel()
        loss = None if labels is None else ((logits.squeeze(-1) - labels) ** 2).sum() / count
        return SimpleNamespace(logits=logits, loss=loss)


def candidates(count=12):
    return [list(range(5, 7 + i % 6)) for i in range(count)], [float(i % 2) for i in range(count)], torch.float32


@pytest.mark.parametrize(
    "model, refusal",
    [
        (Regressor(), None),
        (Regressor(leak=True), "left and right padding give logits"),
        (Regressor(honours=False), "the loss ignores num_items_in_batch"),
        (Regressor(weight=float("nan")), "non-finite loss, logits or gradients"),
    ],
    ids=["sound", "padding-leak", "ignores-num-items", "nan-weight"],
)
def test_the_preflight_keeps_each_check(model, refusal, capsys):
    tokenizer = qwen2_like()
    if refusal is None:
        preflight.preflight(SEQUENCE_CLASSIFIER, model, tokenizer, candidates(), "m")
        assert "[train] pre-flight ok" in capsys.readouterr().err
    else:
        with pytest.raises(SystemExit, match=f"pre-flight check failed: {refusal}.*doctor --model m"):
            preflight.preflight(SEQUENCE_CLASSIFIER, model, tokenizer, candidates(), "m")
    assert model.training and model.weight.grad is None  # left as it was


def test_the_preflight_is_one_step_on_the_model_as_it_trains(base):  # noqa: F811
    """Two forwards (one with a backward) of PREFLIGHT_EXAMPLES short examples of different lengths, on the model with
    LoRA attached: only what trains gets a gradient, and the weights are untouched. The old pre-flight ran a backward
    through every weight and 11 forwards."""
    model = stable_models.from_pretrained(base, num_labels=2, dtype=torch.float32)
    options = SimpleNamespace(full=False, qlora=False, lora_target=None, lora_r=4, lora_dropout=0.0)
    model = with_adapters(model, options, SEQUENCE_CLASSIFIER)
    tokenizer = AutoTokenizer.from_pretrained(base)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    seen, gradients = [], set()
    handle = model.get_input_embeddings().register_forward_pre_hook(  # called as a module by every peft version
        lambda module, args: seen.append((args[0].shape, torch.is_grad_enabled()))
    )
    hooks = [
        p.register_hook(lambda grad, name=name: gradients.add(name))
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    ids = [tokenizer(row["text"])["input_ids"] for row in rows("string", 16)]
    preflight.preflight(SEQUENCE_CLASSIFIER, model, tokenizer, (ids, [i % 2 for i in range(16)], torch.long), base)
    handle.remove()
    for hook in hooks:
        hook.remove()
    assert [(shape[0], grad) for shape, grad in seen] == [(PREFLIGHT_EXAMPLES, True)] + [(PREFLIGHT_EXAMPLES, False)]
    shortest = sorted({len(i) for i in ids})[:PREFLIGHT_EXAMPLES]
    assert seen[0][0][1] == max(shortest)  # the shortest examples, of different lengths
    assert gradients and all("lora_" in name or "score" in name for name in gradients)
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters()) and model.training


def lengths_dataset(examples, tokens):
    return datasets.Dataset.from_dict({"input_ids": [[1] * tokens] * examples, "length": [tokens] * examples})


@pytest.mark.parametrize("eval_examples, steps, expected_evaluations", [(4, 6, 2), (2, 40, 5), (400, 40, 1), (1, 1, 1)])
def test_evaluation_stays_under_its_share_of_the_run(eval_examples, steps, expected_evaluations):
    """Evaluations (forward only) against training (forward and backward, TRAIN_COST forwards a token): as many as
    keep them under EVAL_SHARE, at most 5, at least one; a big eval set is evaluated once, at the last step."""
    args = SimpleNamespace(eval_steps=None, max_steps=steps, batch_size=4, grad_accum=1, epochs=1.0)
    cadence = evaluation_cadence(args, 1, lengths_dataset(64, 10), lengths_dataset(eval_examples, 10))
    evaluations = steps // cadence.steps
    assert evaluations == expected_evaluations
    assert f"evaluating {evaluations} time(s), every {cadence.steps} steps" in cadence.line
    share = evaluations * eval_examples / (evaluations * eval_examples + 2 * 4 * steps)
    assert share <= EVAL_SHARE or evaluations == 1
    if evaluations == 1:
        assert cadence.steps == steps
    given_args = SimpleNamespace(eval_steps=3, epochs=1.0)
    given = evaluation_cadence(given_args, 1, lengths_dataset(4, 1), lengths_dataset(4, 1))
    assert given.steps == 3 and "every 3 steps (--eval-steps)" in given.line


def test_a_default_run_evaluates_each_checkpoint_once_and_leaves_the_model(base, tmp_path, monkeypatch, capfd):  # noqa: F811
    """No --eval-steps: a 6-step run evaluates as often as its printed cadence says (here not after every step), the
    final metrics are the restored best checkpoint's from the log (Trainer.evaluate runs once per logged evaluation,
    never again at the end), and the finished folder has no checkpoints."""
    data = write(tmp_path / "train.jsonl", rows("string"))
    calls = []
    evaluate = Trainer.evaluate
    monkeypatch.setattr(Trainer, "evaluate", lambda self, *a, **k: calls.append(1) or evaluate(self, *a, **k))
    fast = [a for a in FAST if a not in ("--eval-steps", "3")]
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *fast) == 0
    count, every = map(
        int, re.search(r"\[train\] evaluating (\d+) time\(s\), every (\d+) steps", capfd.readouterr().err).groups()
    )
    log = json.loads((tmp_path / "m" / "training_log.json").read_text())
    evaluations = [entry for entry in log if "eval_loss" in entry]
    assert [entry["step"] for entry in evaluations] == [every * (k + 1) for k in range(count)]
    assert count < 6 and len(calls) == count
    final = json.loads((tmp_path / "m" / "eval_metrics.json").read_text())
    best = max(evaluations, key=lambda entry: (entry["eval_f1_macro"], -entry["step"]))
    assert final["f1_macro"] == best["eval_f1_macro"] and final["loss"] == best["eval_loss"]
    assert not (tmp_path / "m" / "checkpoints").exists() and (tmp_path / "m" / "model.safetensors").is_file()


def test_report_to_tensorboard_logs_the_run_under_output(base, tmp_path):  # noqa: F811
    """--report-to tensorboard --run-name: event files under --output/logs/NAME with the training loss, each
    evaluation's metrics and the final (best checkpoint's) metrics; nothing logged without --report-to. Run as the
    `stable-models` command, which ends without the interpreter's teardown: the tracker's files are complete."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = write(tmp_path / "train.jsonl", rows("string"))
    output = tmp_path / "m"
    command = [sys.executable, "-m", "stable_models", "train", "--model", base, "--train", data, "--output", output]
    done = subprocess.run(
        [*map(str, command), *FAST, "--report-to", "tensorboard", "--run-name", "first"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = EventAccumulator(str(output / "logs" / "first"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "eval/loss", "eval/f1_macro", "eval/best_f1_macro"} <= tags
    assert [e.step for e in events.Scalars("eval/f1_macro")] == [3, 6]
    final = json.loads((output / "eval_metrics.json").read_text())
    assert events.Scalars("eval/best_f1_macro")[-1].value == pytest.approx(final["f1_macro"])
    assert run("train", "--model", base, "--train", data, "--output", tmp_path / "plain", *FAST) == 0
    assert not (tmp_path / "plain" / "logs").exists()


def test_a_tracker_that_is_not_installed_is_a_one_line_error(base, tmp_path, monkeypatch, capsys):  # noqa: F811
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    data = write(tmp_path / "train.jsonl", rows("string"))
    assert (
        run("train", "--model", base, "--train", data, "--output", tmp_path / "m", *FAST, "--report-to", "wandb") == 2
    )
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--report-to wandb needs wandb: pip install wandb")
    assert not (tmp_path / "m" / "model.safetensors").exists()
