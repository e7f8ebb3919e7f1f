"""Every architecture in the table: the core contract, against the stock class on the same weights.

The first-class set (architectures.FIRST_CLASS) also runs the full dtype x pooling x padding x feature matrix in the
other test files; here every model type gets finiteness, padding invariance, parity, the mask probe, and the check
that each layer gets the mask its own backbone chose (plus self-attention), not a mask guessed from its name.
"""

import warnings
from pathlib import Path

import pytest
import torch
import transformers
from architectures import (
    ALL_ARCH_ATTN,
    ALL_ARCH_ATTN_IDS,
    ARCHITECTURES,
    BY_NAME,
    DOCS_TRANSFORMERS,
    NO_TINY_CONFIG_YET,
    TABLE,
    TABLE_BY_NAME,
    Arch,
    attention_layer_count,
    is_vision_part,
    logits_alone,
    make_config,
    make_models,
    pad_batch,
    random_sequences,
)
from test_masks import RECORDED, probes, visible  # noqa: F401  (the fixture registers the recording probe)
from transformers.modeling_layers import GradientCheckpointingLayer

import stable_models
from stable_models import modeling_rules
from stable_models.modeling_masks import mask_position, with_self_attention
from stable_models.modeling_rules import BATCH_COUPLED
from stable_models.registry import refused_model_types

LENGTHS = [9, 4, 6]  # up to 5 pads, longer than every sliding window (3)
SUPPORTED_MODELS = Path(__file__).resolve().parent.parent / "docs" / "supported-models.md"


def test_the_table_covers_every_supported_model_type():
    """A new transformers architecture must get a tiny config here before it is called supported."""
    own_types = {
        t
        for t in stable_models.supported_model_types()
        if stable_models.stable_class_for(t).config_class.model_type == t
    }  # not aliases such as code_llama -> llama
    assert own_types == {arch.name for arch in ARCHITECTURES} | (own_types & set(NO_TINY_CONFIG_YET))
    assert len(ARCHITECTURES) >= (49 if transformers.__version__ >= "5.24" else 30)


def test_aliases_get_the_class_of_their_config():
    for model_type in stable_models.supported_model_types():
        cls = stable_models.stable_class_for(model_type)
        assert cls.config_class.model_type in BY_NAME or cls.config_class.model_type == model_type


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=str)
def test_tiny_config_is_the_named_architecture_and_tiny(arch):
    stable, stock = make_models(arch)
    assert stable.config.model_type == arch.name and type(stable).__name__ == "Stable" + type(stock).__name__
    assert isinstance(stable, arch.stock_class) and type(stable).__module__ == "stable_models.modeling_stable"
    assert getattr(stable_models, type(stable).__name__) is type(stable)  # reachable as stable_models.Stable...
    text_parameters = sum(p.numel() for name, p in stable.named_parameters() if not is_vision_part(name))
    assert text_parameters < 300_000
    assert stable.config.get_text_config().num_hidden_layers == arch.config_kwargs.get("num_hidden_layers", 2)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=str)
def test_forward_and_backward_are_finite(arch, side):
    stable, _ = make_models(arch)
    stable.train()
    ids, mask = pad_batch(random_sequences(LENGTHS), side)
    out = stable(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    assert out.logits.dtype == out.loss.dtype == torch.float32
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    grads = {name: p.grad for name, p in stable.named_parameters() if p.requires_grad and not is_vision_part(name)}
    assert stable.score.weight.grad is not None and torch.isfinite(stable.score.weight.grad).all()
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
    assert sum(g is not None for g in grads.values()) >= 0.5 * len(grads)  # MoE: unrouted experts get none


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("arch", "attn"), ALL_ARCH_ATTN, ids=ALL_ARCH_ATTN_IDS)
def test_padded_batch_matches_each_sequence_alone(arch, attn, side):
    stable, _ = make_models(arch, attn)
    sequences = random_sequences(LENGTHS)
    ids, mask = pad_batch(sequences, side)
    with torch.no_grad():
        batched = stable(ids, attention_mask=mask).logits
    assert (batched - logits_alone(stable, sequences)).abs().max() <= 1e-5


@pytest.mark.parametrize(("arch", "attn"), ALL_ARCH_ATTN, ids=ALL_ARCH_ATTN_IDS)
def test_unpadded_logits_equal_the_stock_class(arch, attn):
    stable, stock = make_models(arch, attn)
    ids = torch.stack(random_sequences([7, 7, 7]))
    with torch.no_grad():
        assert (stable(ids).logits - stock(ids).logits).abs().max() <= 1e-5


def recorded(model, ids, mask):
    """The masks the attention kernels receive, through a probe kernel registered with transformers'
    AttentionInterface. Older modeling code (transformers 4.57: DiffLlama, Jamba, JetMoe, Nemotron, PhiMoE,
    Qwen2-MoE, StableLM) calls its kernels directly; there the masks each decoder layer receives are recorded."""
    RECORDED.clear()
    model.set_attn_implementation("recording_probe")
    with torch.no_grad():
        model(ids, attention_mask=mask)
    if RECORDED:
        return list(RECORDED)
    model.set_attn_implementation("eager")
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]

    def record(layer, args, kwargs):
        index = mask_position(type(layer))  # older layers (XGLM) take the mask positionally
        given = kwargs.get("attention_mask", args[index] if index is not None and index < len(args) else None)
        for value in given.values() if isinstance(given, dict) else [given]:  # Zaya: one mask per kind
            if isinstance(value, torch.Tensor) and value.dim() == 4:
                RECORDED.append(visible(value))

    handles = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]  # after the guard's
    with torch.no_grad():
        model(ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    return list(RECORDED)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=str)
def test_each_layer_gets_its_backbones_mask_plus_self_attention(arch, side):
    """No fully masked row reaches a kernel; real tokens never see padding; and each layer's mask is the one the
    stock backbone chose for it (MiniMax gives full_attention layers a sliding mask), with only diagonal entries
    added."""
    stable, stock = make_models(arch)
    ids, mask = pad_batch(random_sequences(LENGTHS), side)
    masks, stock_masks = recorded(stable, ids, mask), recorded(stock, ids, mask)
    # one mask per attention call (DiffLlama's differential attention calls the kernel twice per layer)
    assert len(masks) == len(stock_masks) >= attention_layer_count(stable.config) >= 1
    padding = mask.bool()
    for layer_mask, stock_mask in zip(masks, stock_masks, strict=True):
        if stock_mask is None:  # a kernel call over another axis than the tokens (Inkling 2's loop): none either
            assert layer_mask is None
            continue
        assert layer_mask.any(-1).all(), "a query row with no visible key reached the attention kernel"
        real_queries_see = layer_mask[:, 0] & padding[:, :, None]
        assert not (real_queries_see & ~padding[:, None, :]).any(), "a real token attends to padding"
        # the stock mask, plus only diagonal entries (all of them, except where a sparse indexer, as in Qwen4-Exp,
        # then selects fewer keys than the causal mask allows and leaves the diagonal out, as for the stock class)
        hidden = stock_mask & ~layer_mask
        assert not (hidden & padding[:, None, :, None]).any(), "the Stable class hid a key a real token saw"
        # a top-k indexer (Kolibri 1.1) fills a fixed budget of keys per query: on a padding query the added diagonal
        # takes one key's place, so that row keeps its size instead of every stock key
        budget_rows = hidden.any(-1)
        assert torch.equal(layer_mask.sum(-1)[budget_rows], stock_mask.sum(-1)[budget_rows]), "a padding row grew"
        assert torch.equal(layer_mask & with_self_attention(stock_mask), layer_mask), "a key beyond the diagonal"
    if side == "left" or arch.has_sliding_window:  # leading pads, or trailing pads outside every real window
        assert any((~m.any(-1)).any() for m in stock_masks if m is not None), "the stock class sent no empty row"


def test_minimax_full_attention_layers_get_the_sliding_mask_the_backbone_chose():
    """MiniMax builds its full_attention mask with the sliding-window builder when config.sliding_window is set;
    a mask chosen from the layer's name would let those layers see beyond the window."""
    if "minimax" not in BY_NAME:
        pytest.skip("no MiniMax in this transformers")
    stable, _ = make_models(BY_NAME["minimax"])
    ids, mask = pad_batch(random_sequences(LENGTHS), "right")
    (full_layer_mask,) = recorded(stable, ids, mask)  # layer_types: linear_attention, full_attention
    window = stable.config.sliding_window
    assert not full_layer_mask[0, 0, 8, : 8 - window + 1].any()  # the last token of row 0 sees only its window
    assert full_layer_mask[0, 0, 8, 8 - window + 1 :].all()


def batch_coupling(arch, **overrides):
    """Max logit difference between three identical unpadded rows of one batch (0 for a row-independent model)."""
    stable, _ = make_models(arch, **overrides)
    ids = torch.stack(random_sequences([8]) * 3)
    ids[1:, 0] = 7  # other rows differ in one token
    with torch.no_grad():
        alone = stable(ids[:1]).logits
        batched = stable(ids).logits[:1]
    return (batched - alone).abs().max().item()


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=str)
def test_rows_of_a_batch_do_not_influence_each_other(arch):
    """What makes padding invariance possible at all; the configs that break it are listed in BATCH_COUPLED."""
    assert batch_coupling(arch) <= 1e-5


def test_doge_moe_couples_the_rows_of_a_batch_and_says_so():
    if "doge" not in BY_NAME:
        pytest.skip("no Doge in this transformers")
    arch = BY_NAME["doge"]
    flag, _ = BATCH_COUPLED["doge"]
    moe = dict(is_moe=True, num_experts=16, num_experts_per_tok=2)
    with pytest.warns(UserWarning, match="outputs of one row depend on the other rows of the batch.*batch size 1"):
        _, stock = make_models(arch, **moe)
    ids = torch.stack(random_sequences([8]) * 3)
    ids[1:, 0] = 7
    with torch.no_grad():
        try:
            stock_coupling = (stock(ids).logits[:1] - stock(ids[:1]).logits).abs().max()
        except TypeError:
            pytest.xfail("Doge MoE fails in the stock class's own forward on this transformers (4.57)")
    assert stock_coupling > 1e-3  # the stock class: one row's logits move with the other rows
    with pytest.warns(UserWarning, match="other rows of the batch"):
        assert batch_coupling(arch, **moe) > 1e-3  # and no wrapper can change that
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_models(arch)  # the dense config: no warning, and the full contract holds (tests above)
    assert getattr(make_config(arch, **moe), flag)


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a.multimodal], ids=str)
def test_multimodal_classifier_is_text_only_and_num_labels_reaches_the_text_config(arch, tmp_path):
    stable, _ = make_models(arch)
    assert stable.config.get_text_config() is not stable.config
    assert stable.config.get_text_config().num_labels == stable.config.num_labels == 3
    stable.save_pretrained(tmp_path)
    reloaded = arch.stable_class.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert reloaded.config.get_text_config().num_labels == 5 and reloaded.score.out_features == 5


def readme_architecture_rows():
    """The cells of each row of docs/supported-models.md's table."""
    section = SUPPORTED_MODELS.read_text().split("## Supported architectures", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row] for row in rows]


def test_readme_table_lists_exactly_the_architecture_table():
    rows = readme_architecture_rows()
    assert [row[0] for row in rows] == [f"`{arch.name}`" for arch in TABLE]
    installed = {f"`{arch.name}`": arch for arch in ARCHITECTURES}
    classes = [row[1] for row in rows if row[0] in installed]
    assert classes == [f"`{arch.stable_class.__name__}`" for arch in installed.values()]
    if not transformers.__version__.startswith("4."):  # the "from" column is written for 5.x
        assert [row[2] for row in rows if row[0] in installed] == [arch.origin for arch in installed.values()]
    assert [row[0] for row in rows if row[4] == "yes"] == [f"`{arch.name}`" for arch in TABLE if arch.first_class]
    if transformers.__version__.startswith("4."):  # the floor column says what the 4.57 floor has
        assert [row[0] for row in rows if row[3] == "yes"] == [f"`{arch.name}`" for arch in ARCHITECTURES]


@pytest.mark.skipif(
    transformers.__version__ != DOCS_TRANSFORMERS, reason="the refused table is written for one release"
)
def test_the_refused_table_is_what_the_registry_refuses():
    section = SUPPORTED_MODELS.read_text().split("## Model types without a Stable class", 1)[1].split("\n## ", 1)[0]
    rows = [
        line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ") and "`" in line
    ]
    documented = {t.strip(" `"): reason.strip() for reason, types in rows for t in types.split(",")}
    refused = {t: r.rstrip(".") for t, r in refused_model_types().items()}
    assert documented == refused


def test_stable_class_for_unknown_or_non_decoder_model_types():
    with pytest.raises(ValueError, match="no class for model_type='bert'.*an encoder's.*Supported: .*qwen2"):
        stable_models.stable_class_for("bert")
    with pytest.raises(ValueError, match="model_type='bart'.*encoder-decoder"):
        stable_models.stable_class_for("bart")
    with pytest.raises(ValueError, match="model_type='openai-gpt'.*GradientCheckpointingLayers"):
        stable_models.stable_class_for("openai-gpt")
    with pytest.raises(ValueError, match="no class for model_type='nonsense'"):
        stable_models.stable_class_for("nonsense")
    with pytest.raises(AttributeError):
        stable_models.StableBertForSequenceClassification  # noqa: B018
    assert "qwen3_moe" in stable_models.STABLE_CLASSES or "qwen3_moe" not in TABLE_BY_NAME


# MoE, MLA, hybrid, multimodal; legacy; built by stable_models (dense, and multimodal with no mapping in transformers)
FROM_PRETRAINED_SAMPLE = ["qwen3_moe", "deepseek_v3", "qwen3_next", "gemma3", "phi3", "gpt2", "granite", "gemma4"]


@pytest.mark.parametrize("arch", [BY_NAME[n] for n in FROM_PRETRAINED_SAMPLE if n in BY_NAME], ids=str)
def test_from_pretrained_and_register_pick_the_stable_class(arch, tmp_path):
    """A user's generative checkpoint becomes a Stable classifier by model_type, with or without register()."""
    torch.manual_seed(0)
    arch.causal_lm_class(make_config(arch)).save_pretrained(tmp_path)
    model = stable_models.from_pretrained(tmp_path, num_labels=4)
    assert type(model) is arch.stable_class and model.score.out_features == 4
    with stable_models.registered(arch.name):
        auto = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert type(auto) is arch.stable_class
    if arch.origin == "built by stable_models":  # transformers has no class of its own for it, before or after
        with pytest.raises(ValueError, match="Unrecognized configuration class"):
            transformers.AutoModelForSequenceClassification.from_config(auto.config)
    else:
        assert type(transformers.AutoModelForSequenceClassification.from_config(auto.config)) is arch.stock_class


def test_stable_models_pickle_and_deepcopy_by_name():
    import copy
    import pickle

    stable, _ = make_models(BY_NAME["qwen3_moe" if "qwen3_moe" in BY_NAME else "qwen2"])
    ids, mask = pad_batch(random_sequences(LENGTHS), "left")
    with torch.no_grad():
        expected = stable(ids, attention_mask=mask).logits
        for clone in (pickle.loads(pickle.dumps(stable)), copy.deepcopy(stable)):
            assert type(clone) is type(stable)
            assert (clone(ids, attention_mask=mask).logits - expected).abs().max() <= 1e-6
            assert clone._mask_guard is not stable._mask_guard


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a.has_causal_lm], ids=str)
def test_a_causal_lm_checkpoint_loads_every_backbone_weight_and_initialises_only_the_head(arch, tmp_path):
    torch.manual_seed(0)
    causal = arch.causal_lm_class(make_config(arch))
    causal.save_pretrained(tmp_path)
    model, info = arch.stable_class.from_pretrained(tmp_path, num_labels=4, output_loading_info=True)
    assert info["missing_keys"] and all(key.split(".")[0] == "score" for key in info["missing_keys"]), info
    assert not info["mismatched_keys"] and not info.get("error_msgs")
    backbone = getattr(model, model.base_model_prefix).state_dict()
    saved = causal.state_dict()
    prefix = model.base_model_prefix + "."
    same = [k for k in backbone if (prefix + k) in saved and torch.equal(saved[prefix + k], backbone[k])]
    assert len(same) >= len(backbone) // 2  # the checkpoint's weights, not fresh ones (tied / converted keys aside)


@pytest.mark.skipif(transformers.__version__ != DOCS_TRANSFORMERS, reason="the README's counts are for one release")
def test_the_readme_counts_what_the_registry_supports():
    import re

    readme = (SUPPORTED_MODELS.parent.parent / "README.md").read_text()
    first = " ".join(readme.split("\n\n")[2].split())
    supported, tested, built = map(
        int,
        re.search(
            rf"(\d+) model types on transformers {DOCS_TRANSFORMERS[:4]}, (\d+) of them tested.* including (\d+) "
            "causal",
            first,
        ).groups(),
    )
    assert supported == len(stable_models.supported_model_types())
    assert tested == len(ARCHITECTURES)
    assert built == sum(Arch(t).origin == "built by stable_models" for t in stable_models.supported_model_types())


def test_the_docs_list_the_types_built_but_not_tested():
    section = SUPPORTED_MODELS.read_text().split("## Built but not yet tested here", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("|")[1].strip(" `") for line in section.splitlines() if line.startswith("| `")}
    assert listed == set(NO_TINY_CONFIG_YET)
    if not transformers.__version__.startswith("4."):  # the list is written for 5.x (4.57 refuses some of them)
        assert not listed & set(refused_model_types())
    assert not listed & set(TABLE_BY_NAME)  # a type gets a row or is listed here, not both


def test_a_class_built_for_a_type_the_tests_do_not_cover_says_so(monkeypatch):
    # the one untested type (gemma3n) cannot be built here (its vision tower needs timm), so mark a tested one
    monkeypatch.setitem(modeling_rules.NOT_YET_TESTED, "qwen2", "a reason")
    with pytest.warns(UserWarning, match="tests do not cover model_type='qwen2' yet \\(a reason\\).*not verified"):
        BY_NAME["qwen2"].stable_class(make_config(BY_NAME["qwen2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a tested type constructs silently
        BY_NAME["llama"].stable_class(make_config(BY_NAME["llama"]))
