"""A newcomer's mistakes: each gets a ValueError (or one warning) that names the fix, never a stack trace from deep
inside transformers, a silently wrong number, or a state change that breaks the next correct call."""

import warnings
from pathlib import Path

import pytest
import torch
from architectures import BY_NAME, PAD, logits_alone, make_models, pad_batch, random_sequences

ARCHS = [BY_NAME["qwen2"], BY_NAME["gemma2"]]


@pytest.fixture(params=ARCHS, ids=str)
def models(request):
    return make_models(request.param)


def batch(side="left"):
    return pad_batch(random_sequences([6, 3]), side)


@pytest.mark.parametrize("trailing", ["ones", "zeros"])
def test_mask_longer_than_the_inputs(models, trailing):
    stable, stock = models
    ids, mask = batch("right")
    fill = torch.ones if trailing == "ones" else torch.zeros
    longer = torch.cat([mask, fill(2, 2, dtype=mask.dtype)], dim=1)
    with pytest.raises(ValueError, match=r"attention_mask has 8 positions but the inputs have 6 .*no cache"):
        stable(ids, attention_mask=longer)
    with torch.no_grad():  # the stock class silently uses a slice of the mask it was given
        assert stock(ids, attention_mask=longer).logits.shape == (2, 3)


def test_additive_mask_is_refused(models):
    stable, stock = models
    ids, mask = batch()
    additive = (1.0 - mask.float()) * torch.finfo(torch.float32).min  # 0 = attend, large negative = padding
    with pytest.raises(ValueError, match=r"attention_mask holds values other than 0 and 1 .*additive.*1 for tokens"):
        stable(ids, attention_mask=additive)


def test_additive_mask_with_every_row_padded_was_silently_inverted(models):
    """The old check saw no all-zero row and went on: logits off by 0.12 here."""
    stable, _ = models
    sequences = random_sequences([6, 3, 5])
    ids, mask = pad_batch(sequences, "left")
    ids, mask = torch.cat([torch.full((3, 1), PAD), ids], 1), torch.cat([torch.zeros(3, 1, dtype=mask.dtype), mask], 1)
    with pytest.raises(ValueError, match="additive"):
        stable(ids, attention_mask=(1.0 - mask.float()) * -1e9)
    with torch.no_grad():
        assert (stable(ids, attention_mask=mask).logits - logits_alone(stable, sequences)).abs().max() <= 1e-5


def test_one_dimensional_input_ids(models):
    stable, _ = models
    ids, _ = batch()
    with pytest.raises(ValueError, match=r"input_ids has shape \(6,\): pass a 2-D \(batch, sequence\).*ids\[None\]"):
        stable(ids[0])


def test_labels_as_a_python_list(models):
    stable, _ = models
    ids, mask = batch()
    with pytest.raises(ValueError, match=r"labels is a list: pass a tensor.*torch.tensor\(labels\)"):
        stable(ids, attention_mask=mask, labels=[0, 1])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_integer_labels_of_any_width_are_class_ids(models, dtype):
    stable, stock = models
    ids, mask = batch()
    labels = torch.tensor([2, 0])
    expected = stable(ids, attention_mask=mask, labels=labels).loss
    stable.config.problem_type = None
    assert torch.allclose(stable(ids, attention_mask=mask, labels=labels.to(dtype)).loss, expected)
    assert stable.config.problem_type == "single_label_classification"
    if dtype in (torch.int16, torch.uint8):  # the stock class takes them for multi-label targets
        with pytest.raises((ValueError, RuntimeError)):
            stock(ids, attention_mask=mask, labels=labels.to(dtype))


def test_float_class_ids_say_which_problem_type_they_imply_and_change_nothing(models):
    stable, stock = models
    ids, mask = batch()
    with pytest.raises(
        ValueError,
        match=r"float labels of shape \(2,\) with num_labels=3.*labels.long\(\).*"
        r"multi_label_classification.*\(batch, 3\).*problem_type",
    ):
        stable(ids, attention_mask=mask, labels=torch.tensor([2.0, 0.0]))
    assert stable.config.problem_type is None  # the failed call left the config as it was
    assert torch.isfinite(stable(ids, attention_mask=mask, labels=torch.tensor([2, 0])).loss)
    with pytest.raises((ValueError, RuntimeError)):  # the stock class stores multi-label and fails every later call
        stock(ids, attention_mask=mask, labels=torch.tensor([2.0, 0.0]))
    assert stock.config.problem_type == "multi_label_classification"
    with pytest.raises((ValueError, RuntimeError)):
        stock(ids, attention_mask=mask, labels=torch.tensor([2, 0]))


def test_multi_label_targets_of_the_wrong_shape(models):
    stable, _ = models
    ids, mask = batch()
    stable.config.problem_type = "multi_label_classification"
    with pytest.raises(ValueError, match=r"multi_label_classification needs labels of shape \(2, 3\)"):
        stable(ids, attention_mask=mask, labels=torch.ones(2, 2))


def test_padded_ids_without_a_mask_warn_once(models):
    stable, stock = models
    sequences = random_sequences([6, 3])
    ids, mask = pad_batch(sequences, "right")
    with torch.no_grad():
        assert (stock(ids).logits - logits_alone(stable, sequences)).abs().max() <= 1e-5  # the stock finds pads by id
        with pytest.warns(UserWarning, match=r"end in pad_token_id .* no attention_mask.*pass attention_mask") as seen:
            stable(ids)
        assert Path(seen[0].filename).resolve() == Path(__file__).resolve()  # points at the user's line
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            stable(ids)  # once per model
            stable(ids, attention_mask=mask)


def test_low_precision_warning_points_at_the_users_line():
    stable, _ = make_models(BY_NAME["qwen2"], dtype=torch.bfloat16)
    stable.train()
    ids, mask = batch()
    with pytest.warns(UserWarning, match="without fp32 master weights") as seen:
        stable(ids, attention_mask=mask, labels=torch.tensor([0, 1]))
    assert Path(seen[0].filename).resolve() == Path(__file__).resolve()


def test_a_model_built_from_a_config_warns_visibly_at_save_in_a_fresh_interpreter(tmp_path):
    """No tokenizer anywhere: the warning reaches stderr under Python's default warning filters, naming the fix."""
    import json
    import subprocess
    import sys

    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from architectures import BY_NAME, make_config\n"
        "arch = BY_NAME['qwen2']\n"
        f"arch.stable_class(make_config(arch, pad_token_id=None)).save_pretrained({str(tmp_path)!r})\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "gets no pad_token_id" in run.stderr and "setup_pad_token(tokenizer, model)" in run.stderr
    assert json.loads((tmp_path / "config.json").read_text()).get("pad_token_id") is None


def test_input_longer_than_the_positions_warns_once(models):
    stable, stock = models
    limit = stable.config.get_text_config().max_position_embeddings = 8
    ids = torch.stack(random_sequences([limit + 2, limit + 2]))
    with pytest.warns(
        UserWarning, match=rf"input of 10 positions is longer than .*max_position_embeddings \({limit}\)"
    ):
        stable(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stable(ids)  # once per model
        fresh = make_models(ARCHS[0])[0]
        fresh.config.get_text_config().max_position_embeddings = 8
        for side in ("left", "right"):  # 8 real tokens fit, however wide the padding makes the row
            ids, mask = pad_batch(random_sequences([8, 3]), side)
            padding = torch.zeros(2, 4, dtype=torch.long)
            ids, mask = (
                (torch.cat([padding, ids], 1), torch.cat([padding, mask], 1))
                if side == "left"
                else (
                    torch.cat([ids, padding], 1),
                    torch.cat([mask, padding], 1),
                )
            )
            fresh(ids, attention_mask=mask)
