"""`python -m stable_models doctor --log`: each known failure pattern in a Trainer log is named with its fix."""

import json
import math

import pytest
import torch
from architectures import BY_NAME, collate_left, cpu_training_args, make_config, toy_dataset
from test_doctor import doctor
from transformers import Trainer


def doctor_log(path, *extra):
    """`python -m stable_models doctor --log PATH ...` (in this process)."""
    return doctor("--log", path, *extra)


def trainer_state(path, steps):
    history = [{"step": i + 1, "epoch": i / 10, "learning_rate": 1e-4, **s} for i, s in enumerate(steps)]
    path.write_text(json.dumps({"log_history": history, "global_step": len(steps)}))
    return path


def text_log(path, steps):
    """What Trainer prints in transformers 5 (values as strings)."""
    path.write_text("".join(str({k: f"{v:.4g}" for k, v in s.items()}) + "\n" for s in steps) + "100%|####| done\n")
    return path


@pytest.mark.parametrize("write", [trainer_state, text_log], ids=["trainer_state", "text"])
def test_hidden_nan(tmp_path, write):
    steps = [{"loss": 1.09, "grad_norm": 3.1}, {"loss": 0.0, "grad_norm": float("nan")}] + [
        {"loss": 0.0, "grad_norm": float("nan")}
    ] * 3
    code, out, err = doctor_log(write(tmp_path / "log", steps))
    assert code == 1, out + err
    assert "step 2: loss 0.0 with grad_norm nan" in out and "logging_nan_inf_filter" in out
    assert "StopOnNonFinite" in out


def test_stuck_at_ln_k_with_no_gradient(tmp_path):
    steps = [{"loss": math.log(3), "grad_norm": 0.0}] * 6
    code, out, _ = doctor_log(trainer_state(tmp_path / "s.json", steps))
    assert code == 1 and "loss stuck at ln(3) = 1.0986 with grad_norm 0.0 in 6 of 6" in out
    assert "modules_to_save" in out and "-100" in out


def test_losses_on_the_bf16_grid(tmp_path):
    values = [1.09375, 0.8515625, 0.5078125, 0.26953125, 0.1396484375]
    code, out, _ = doctor_log(trainer_state(tmp_path / "s.json", [{"loss": v, "grad_norm": 1.0} for v in values]))
    assert code == 1 and "lie on the bf16 grid" in out and "fp32 head, logits and loss" in out


def test_flat_loss_with_moving_gradients(tmp_path):
    steps = [{"loss": 0.6931 + 1e-5 * (i % 2), "grad_norm": 0.8} for i in range(10)]
    code, out, _ = doctor_log(trainer_state(tmp_path / "s.json", steps), "--num-labels", "5")
    assert code == 1 and "the loss is flat" in out and "dtype=torch.float32" in out


def test_healthy_log(tmp_path):
    steps = [{"loss": 1.1 * 0.8**i + 0.0123 * i, "grad_norm": 2.0 - 0.1 * i} for i in range(10)]
    code, out, _ = doctor_log(trainer_state(tmp_path / "s.json", steps))
    assert code == 0 and "none of the known failure patterns" in out


def test_missing_or_empty_log(tmp_path):
    code, _, err = doctor_log(tmp_path / "nothing.json")
    assert code == 2 and "no such file" in err and "Traceback" not in err
    (tmp_path / "empty.log").write_text("nothing here\n")
    code, _, err = doctor_log(tmp_path / "empty.log")
    assert code == 2 and "no logged training loss" in err


def test_a_real_trainer_log_of_the_stock_class_with_gradient_accumulation(tmp_path):
    """The stock class under Trainer with gradient_accumulation_steps=4 logs ~4 x ln(3) at the start."""
    arch = BY_NAME["qwen2"]
    torch.manual_seed(0)
    model = arch.stock_class(make_config(arch))  # default init: near-uniform logits, loss ~ ln(3)
    args = cpu_training_args(
        tmp_path / "run", per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=2, learning_rate=1e-5
    )
    trainer = Trainer(model=model, args=args, train_dataset=toy_dataset([4] * 16, seed=3), data_collator=collate_left)
    trainer.train()
    trainer.state.save_to_json(str(tmp_path / "trainer_state.json"))
    code, out, _ = doctor_log(tmp_path / "trainer_state.json", "--num-labels", "3")
    assert code == 1 and "4 x ln(3)" in out and "inflated 4x" in out and "num_items_in_batch" in out


def doctor_log_here(capsys, path, *extra):
    """`doctor --log` in this process (the command line itself is tested above): (exit code, stdout, stderr)."""
    from stable_models.cli.doctor import main

    capsys.readouterr()
    code = main(["--log", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


# User story B's own lines, as transformers 4.x prints them (bare nan: Python's repr of a float dict).
STORY_B_NAN = "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1.9e-05, 'epoch': 0.33}\n"
STORY_B_STUCK = "{'loss': 1.0986, 'grad_norm': 0.0, 'learning_rate': 1.9e-05, 'epoch': 0.33}\n"


def test_story_b_hidden_nan_as_transformers_4_prints_it(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("{'loss': 1.0432, 'grad_norm': 5.1, 'learning_rate': 2e-05, 'epoch': 0.17}\n" + STORY_B_NAN * 4)
    code, out, err = doctor_log_here(capsys, log)
    assert code == 1, out + err
    assert "step 2: loss 0.0 with grad_norm nan" in out and "logging_nan_inf_filter" in out
    only_nan = tmp_path / "only_nan.log"
    only_nan.write_text(STORY_B_NAN * 3)
    code, out, err = doctor_log_here(capsys, only_nan)
    assert code == 1 and "loss 0.0 with grad_norm nan" in out, out + err


def test_story_b_stuck_at_ln_3_as_transformers_4_prints_it(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("  5%|#         | 2/40 [00:03<01:02]" + STORY_B_STUCK * 6)
    code, out, err = doctor_log_here(capsys, log)
    assert code == 1, out + err
    assert "loss stuck at ln(3) = 1.0986 with grad_norm 0.0 in 6 of 6" in out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_every_form_the_installed_transformers_prints(tmp_path, value, capsys):
    """The installed release's own printers (the progress bar's and PrinterCallback's), whatever they make of
    non-finite floats (4.57: bare nan / inf; 5.x: strings)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerControl, TrainerState

    state = TrainerState()
    logs = [{"loss": 0.0, "grad_norm": value, "learning_rate": 1e-5, "epoch": 0.1 * i} for i in range(1, 4)]
    progress = ProgressCallback()
    progress.training_bar = type("Bar", (), {"write": staticmethod(print)})()
    for entry in logs:
        progress.on_log(None, state, TrainerControl(), logs=dict(entry))
        PrinterCallback().on_log(None, state, TrainerControl(), logs=dict(entry))
    log = tmp_path / "train.log"
    log.write_text(capsys.readouterr().out)
    code, out, err = doctor_log_here(capsys, log)
    if value != value:  # nan: the hidden-NaN pattern
        assert code == 1 and "loss 0.0 with grad_norm nan" in out, out + err
    else:  # read as a number: no pattern claims an infinite grad norm, and nothing is dropped
        assert code == 0 and "6 logged steps" in out, out + err


def test_unreadable_lines_are_said_not_ok(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("{'loss': 0.0, 'grad_norm': tensor(nan), 'epoch': 0.1}\n" * 3)
    code, out, err = doctor_log_here(capsys, log)
    assert code == 2 and "3 of 3 logged dicts could not be read" in err and "trainer_state.json" in err, out + err
