"""Padding-free packed batches: every example gets its unpadded logits, and the loss equals the padded batch's."""

import pytest
import torch
from architectures import (
    ARCH_ATTN,
    ARCH_ATTN_IDS,
    BY_NAME,
    FIRST_CLASS,
    attention_layer_count,
    collate_left,
    cpu_training_args,
    has_recurrent_layers,
    logits_alone,
    make_models,
    pad_batch,
    random_sequences,
    toy_dataset,
)
from test_masks import RECORDED, probes  # noqa: F401  (the fixture registers the recording probe)
from transformers import Trainer

from stable_models import PackedCollator
from stable_models.modeling_rules import PACKING_NEEDS, transformers_version
from stable_models.packing import first_fit_decreasing, rows_near_the_longest

LENGTHS = [9, 4, 6, 1, 5]


def packed(sequences, labels=None):
    features = [
        {"input_ids": s} | ({"labels": labels[i]} if labels is not None else {}) for i, s in enumerate(sequences)
    ]
    return PackedCollator(max_tokens=None)(features)  # one row


def packs(arch) -> bool:
    """Packed batches are taken (others refuse them: recurrent layers, or a transformers release too old)."""
    need = PACKING_NEEDS.get(arch.name)
    return not has_recurrent_layers(arch) and not (need and transformers_version() < need[0])


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN, ids=ARCH_ATTN_IDS)
def test_packed_logits_and_loss(arch, attn, pooling):
    stable, stock = make_models(arch, attn, pooling=pooling)
    sequences = random_sequences(LENGTHS)
    labels = torch.tensor([0, 1, 2, 1, 0])
    batch = packed(sequences, labels)
    assert batch["input_ids"].shape == (1, sum(LENGTHS)) and "attention_mask" not in batch
    if has_recurrent_layers(arch):  # the recurrent state crosses example boundaries: refuse, do not mislead
        with torch.no_grad():
            hidden = stock.model(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state[0]
            alone = stock.model(sequences[1][None]).last_hidden_state[0, -1]
        assert (hidden[LENGTHS[0] + LENGTHS[1] - 1] - alone).abs().max() > 1e-3  # the stock backbone leaks
        with pytest.raises(ValueError, match="state runs along the whole row.*Pad instead of packing"):
            stable(**batch)
        return
    if (need := PACKING_NEEDS.get(arch.name)) and transformers_version() < need[0]:  # measured wrong: refuse
        with torch.no_grad():
            hidden = stock.base_model(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state[0]
            alone = stock.base_model(sequences[1][None]).last_hidden_state[0, -1]
        assert (hidden[LENGTHS[0] + LENGTHS[1] - 1] - alone).abs().max() > 1e-3  # the backbone mixes the examples
        with pytest.raises(ValueError, match="packed batches need transformers >= 5.*pad instead of packing"):
            stable(**batch)
        return
    with torch.no_grad():
        out = stable(**batch)
        ids, mask = pad_batch(sequences, "left")
        padded_loss = stable(ids, attention_mask=mask, labels=labels).loss
    assert out.logits.shape == (len(LENGTHS), 3)
    assert (out.logits - logits_alone(stable, sequences)).abs().max() <= 1e-5
    assert abs(out.loss - padded_loss) <= 1e-5


@pytest.mark.parametrize("arch", [a for a in FIRST_CLASS if packs(a)], ids=str)  # others refuse
def test_packed_masks_are_block_diagonal_without_empty_rows(arch):
    stable, _ = make_models(arch)
    sequences = random_sequences(LENGTHS)
    batch = packed(sequences)
    RECORDED.clear()
    stable.set_attn_implementation("recording_probe")
    with torch.no_grad():
        stable(**batch)
    masks = list(RECORDED)
    example = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    same_example = example[:, None] == example[None, :]
    assert len(masks) == attention_layer_count(stable.config)
    for layer_mask in masks:
        assert layer_mask is not None and layer_mask.any(-1).all()
        assert not (layer_mask[0, 0] & ~same_example).any(), "attention crosses examples"


def test_trainer_with_the_packing_collator(tmp_path):
    dataset = toy_dataset([3 + i % 7 for i in range(16)], seed=4)
    args = cpu_training_args(
        tmp_path,
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=1e-3,
    )
    model = make_models(BY_NAME["qwen2"])[0]
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=PackedCollator())
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


CAPPED_ARCH_ATTN = [(a, attn) for a, attn in ARCH_ATTN if packs(a)]


def test_default_rows_are_capped_at_the_longest_example():
    batch = PackedCollator()([{"input_ids": s} for s in random_sequences(LENGTHS)])
    assert batch["input_ids"].shape == (3, 9)  # 9 | 6+1 | 5+4: no row longer than a padded row would be
    assert batch["attention_mask"].sum() == sum(LENGTHS)


def test_default_rows_grow_a_little_where_that_saves_a_row():
    lengths = [400, 300, 200, 150, 100, 50, 20, 10]  # at 400: 400 | 300+100 | 200+150+50 | 20+10, 4 rows
    assert len(first_fit_decreasing(lengths, 400)) == 4
    rows = rows_near_the_longest(lengths)
    width = max(sum(lengths[i] for i in row) for row in rows)
    assert len(rows) == 3 and width <= 420  # 3 x 420 tokens instead of 4 x 400, and less attention work
    assert len(rows) * width**2 < 4 * 400**2


def test_default_rows_never_cost_more_than_padding_or_the_plain_packing():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        count = int(torch.randint(2, 40, (), generator=generator))
        lengths = torch.randint(1, 300, (count,), generator=generator).tolist()
        plain, rows = first_fit_decreasing(lengths, max(lengths)), rows_near_the_longest(lengths)
        assert sorted(i for row in rows for i in row) == list(range(count))
        width = max(sum(lengths[i] for i in row) for row in rows)
        assert len(rows) * width <= len(plain) * max(lengths) <= count * max(lengths)  # tokens (activations)
        assert len(rows) * width**2 <= len(plain) * max(lengths) ** 2  # attention work and score memory


def test_first_fit_decreasing_rows():
    lengths = [9, 4, 6, 1, 5, 20]
    rows = first_fit_decreasing(lengths, 12)
    assert sorted(i for row in rows for i in row) == list(range(6))
    assert [20] in [[lengths[i] for i in row] for row in rows]  # longer than a row: a row of its own
    assert all(sum(lengths[i] for i in row) <= 12 for row in rows if len(row) > 1)
    assert len(rows) == 4  # 20 | 9+1 | 6+5 | 4  (the lower bound is ceil(45 / 12) = 4)


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize(("arch", "attn"), CAPPED_ARCH_ATTN, ids=[f"{a}-{t}" for a, t in CAPPED_ARCH_ATTN])
def test_capped_rows_give_each_example_its_logits_in_feature_order(arch, attn, pooling):
    stable, stock = make_models(arch, attn, pooling=pooling)
    sequences = random_sequences(LENGTHS)
    labels = torch.tensor([0, 1, 2, 1, 0])
    batch = PackedCollator(max_tokens=12)(
        [{"input_ids": s, "labels": y} for s, y in zip(sequences, labels, strict=True)]
    )
    assert batch["input_ids"].shape == (3, 11) and batch["attention_mask"].sum() == sum(LENGTHS)
    assert batch["packed_example_index"].tolist() != list(range(5))  # first-fit decreasing moved them
    with torch.no_grad():
        out = stable(**batch)
        ids, mask = pad_batch(sequences, "left")
        padded_loss = stable(ids, attention_mask=mask, labels=labels).loss
    assert out.logits.shape == (5, 3)
    assert (out.logits - logits_alone(stable, sequences)).abs().max() <= 1e-5
    assert abs(out.loss - padded_loss) <= 1e-5
    with torch.no_grad():  # the stock class reads one logit per row: rows, not examples
        assert (
            stock(**{k: v for k, v in batch.items() if k not in ("packed_example_index", "labels")}).logits.shape[0]
            == 3
        )


@pytest.mark.parametrize("arch", [a for a in FIRST_CLASS if packs(a)], ids=str)
def test_capped_rows_masks_are_block_diagonal_and_padding_is_its_own_block(arch):
    stable, _ = make_models(arch)
    sequences = random_sequences(LENGTHS)
    batch = PackedCollator(max_tokens=12)([{"input_ids": s} for s in sequences])
    RECORDED.clear()
    stable.set_attn_implementation("recording_probe")
    with torch.no_grad():
        stable(**batch)
    masks = list(RECORDED)
    assert len(masks) == attention_layer_count(stable.config)
    real = batch["attention_mask"].bool()
    first_pad = ~real & ((~real).long().cumsum(-1) == 1)
    starts = (batch["position_ids"] == 0) & real | first_pad  # each example, and a row's padding, is a segment
    segment = starts.long().cumsum(-1)
    same = segment[:, :, None] == segment[:, None, :]
    for layer_mask in masks:
        assert layer_mask.any(-1).all(), "a query row with no visible key reached the attention kernel"
        sees = layer_mask[:, 0]
        assert not (sees & real[:, :, None] & ~same).any(), "a real token sees another example or padding"
        assert not (sees & real[:, :, None] & ~real[:, None, :]).any()


def test_packed_batch_with_padding_in_front_is_refused():
    stable, _ = make_models(BY_NAME["qwen2"])
    ids = torch.tensor([[0, 5, 6, 7, 8], [5, 6, 7, 8, 9]])
    positions = torch.tensor([[0, 0, 1, 0, 1], [0, 1, 2, 0, 1]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="padding must come at the end of a row"):
        stable(ids, attention_mask=mask, position_ids=positions)


def test_trainer_with_capped_rows_and_accumulation_matches_the_padded_run(tmp_path):
    dataset = toy_dataset([3 + (5 * i) % 13 for i in range(16)], seed=7)
    runs = {}
    for name, collator, steps in (
        ("padded", collate_left, 1),
        ("capped", PackedCollator(max_tokens=24), 1),
        ("capped-ga", PackedCollator(max_tokens=24), 4),
    ):
        args = cpu_training_args(
            tmp_path / name,
            per_device_train_batch_size=16 // steps,
            gradient_accumulation_steps=steps,
            max_steps=2,
            learning_rate=1e-2,
            optim="sgd",
            dataloader_drop_last=True,
        )
        model = make_models(BY_NAME["qwen2"])[0]
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
        trainer.train()
        runs[name] = (
            [e["loss"] for e in trainer.state.log_history if "loss" in e],
            torch.cat([p.detach().flatten() for p in model.parameters()]),
        )
    for name in ("capped", "capped-ga"):
        assert runs[name][0] == pytest.approx(runs["padded"][0], rel=1e-5)
        assert (runs[name][1] - runs["padded"][1]).abs().max() <= 1e-5


def test_empty_example_is_refused():
    with pytest.raises(ValueError, match="have no tokens"):
        PackedCollator()([{"input_ids": [5, 6]}, {"input_ids": []}])
