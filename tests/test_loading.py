"""Contract point 9: checkpoints carry their own code and load back through AutoModel without stable_models."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from architectures import (
    ARCHITECTURES,
    BY_NAME,
    FIRST_CLASS,
    LORA_TARGETS,
    collate_left,
    cpu_training_args,
    make_config,
    make_models,
    pad_batch,
    random_sequences,
    toy_dataset,
)
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, Trainer

import stable_models
from stable_models.modeling_files import code_files

# the core: save_pretrained copies modeling_stable.py and the modeling_* siblings it imports, and only those
# what a classifier's save copies: modeling_stable.py and its siblings (an embedder's also takes modeling_embedding.py)
CORE_FILES = sorted(code_files(str(Path(stable_models.__file__).parent), "modeling_stable.py"))
REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{deps!r}]
    try:
        import stable_models
    except ImportError:
        pass
    else:
        raise SystemExit("the isolated interpreter can import stable_models: the test would prove nothing")
    import torch
    from transformers import AutoModelForSequenceClassification
    ids, mask = torch.load({inputs!r})
    results = {{}}
    for folder in {folders!r}:
        for path in (folder, folder + "-resaved"):
            model = AutoModelForSequenceClassification.from_pretrained(
                path, trust_remote_code=True, attn_implementation="eager").eval()
            with torch.no_grad():
                results[path] = (type(model).__module__ + "." + type(model).__name__,
                                 model(input_ids=ids, attention_mask=mask).logits)
            if path == folder:
                model.save_pretrained(folder + "-resaved")
    torch.save(results, {output!r})
    """
)


@pytest.fixture(scope="session")
def isolated_site(tmp_path_factory):
    """A folder of links to every installed package except stable_models (and peft): run with `python -I -S`."""
    import transformers

    site_packages = Path(transformers.__file__).resolve().parent.parent
    links = tmp_path_factory.mktemp("isolated_site")
    for entry in site_packages.iterdir():
        if entry.name.startswith(("stable_models", "__editable__", "peft", "_virtualenv")) or entry.suffix == ".pth":
            continue
        (links / entry.name).symlink_to(entry)
    return str(links)


ROUND_TRIP_IDS, ROUND_TRIP_MASK = pad_batch(random_sequences([7, 3, 5]), "left")


def run_isolated(isolated_site, tmp_path, folders):
    """Load every folder (and its re-save) through AutoModel + trust_remote_code in one interpreter that cannot
    import stable_models; {path: (class path, logits)}."""
    inputs, output = tmp_path / "inputs.pt", tmp_path / "remote.pt"
    torch.save((ROUND_TRIP_IDS, ROUND_TRIP_MASK), inputs)
    code = REMOTE_LOAD.format(
        deps=isolated_site, inputs=str(inputs), folders=[str(f) for f in folders], output=str(output)
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], check=True, env=env, cwd=tmp_path, capture_output=True, text=True
    )
    return torch.load(output)


# at least one MoE, one MLA, one hybrid recurrent and one multimodal model; every architecture with -m exhaustive
# and the legacy (gpt2, mpt) and built (gemma4_text, granite: no sequence-classification mapping in transformers) kinds
SAMPLE = ["qwen2", "gemma2", "llama", "qwen3_moe", "deepseek_v3", "qwen3_next", "jamba", "gemma3", "qwen3_5"]
SAMPLE += ["gpt2", "mpt", "gemma4_text", "granite"]
SAMPLE_CASES = [
    (BY_NAME[n], pooling) for i, n in enumerate(SAMPLE) if n in BY_NAME for pooling in [("last", "mean")[i % 2]]
]
ALL_CASES = [(arch, pooling) for arch in ARCHITECTURES for pooling in ("last", "mean")]


def case_id(case):
    return f"{case[0]}-{case[1]}"


def round_trips(cases, tmp_path, isolated_site):
    """Save each case with its Stable class, load all of them in one isolated interpreter."""
    saved = {}
    for arch, pooling in cases:
        stable, _ = make_models(arch, pooling=pooling)
        folder = tmp_path / case_id((arch, pooling))
        stable.save_pretrained(folder)
        with torch.no_grad():
            expected = stable(ROUND_TRIP_IDS, attention_mask=ROUND_TRIP_MASK).logits
        saved[case_id((arch, pooling))] = (folder, expected)
    results = run_isolated(isolated_site, tmp_path, [folder for folder, _ in saved.values()])
    return {key: (folder, expected, results) for key, (folder, expected) in saved.items()}


@pytest.fixture(scope="module")
def sample_round_trips(tmp_path_factory, isolated_site):
    return round_trips(SAMPLE_CASES, tmp_path_factory.mktemp("sample"), isolated_site)


@pytest.fixture(scope="module")
def all_round_trips(tmp_path_factory, isolated_site):
    return round_trips(ALL_CASES, tmp_path_factory.mktemp("all"), isolated_site)


def check_round_trip(case, trips):
    arch, pooling = case
    folder, expected, results = trips[case_id(case)]
    config = json.loads((folder / "config.json").read_text())
    name = arch.stable_class.__name__
    assert config["auto_map"] == {"AutoModelForSequenceClassification": f"modeling_stable.{name}"}
    assert config["classifier_pooling"] == pooling and config["model_type"] == arch.name
    assert sorted(p.name for p in folder.glob("*.py")) == CORE_FILES  # the core, nothing else
    for path in (folder, Path(f"{folder}-resaved")):
        class_path, logits = results[str(path)]
        assert class_path.startswith("transformers_modules.") and class_path.endswith("." + name)
        assert (logits - expected).abs().max() <= 1e-6
    resaved = Path(f"{folder}-resaved")
    assert json.loads((resaved / "config.json").read_text())["auto_map"] == config["auto_map"]
    assert sorted(p.name for p in resaved.glob("*.py")) == CORE_FILES


@pytest.mark.parametrize("case", SAMPLE_CASES, ids=case_id)
def test_remote_code_round_trip_without_stable_models(case, sample_round_trips):
    check_round_trip(case, sample_round_trips)


@pytest.mark.exhaustive
@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_remote_code_round_trip_every_architecture(case, all_round_trips):
    check_round_trip(case, all_round_trips)


def test_copied_code_importing_stable_models_fails_the_isolated_load(tmp_path, isolated_site):
    arch = BY_NAME["qwen2"]
    stable, _ = make_models(arch)
    folder = tmp_path / "saved"
    stable.save_pretrained(folder)
    code = folder / "modeling_stable.py"
    code.write_text("import stable_models\n" + code.read_text())
    with pytest.raises(subprocess.CalledProcessError) as failure:
        run_isolated(isolated_site, tmp_path, [folder])
    assert "stable_models" in failure.value.stderr


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_which_class_loads(arch, tmp_path):
    stable, _ = make_models(arch)
    stable.save_pretrained(tmp_path)
    if arch.origin == "built by stable_models":  # transformers has no classifier of its own to fall back to
        with pytest.raises(ValueError, match="trust_remote_code"):
            AutoModelForSequenceClassification.from_pretrained(tmp_path)
    else:
        assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path)) is arch.stock_class  # silently stock
    remote = AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(remote).__name__ == arch.stable_class.__name__ and type(remote) is not arch.stable_class
    with stable_models.registered():
        assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path)) is arch.stable_class
    if arch.origin != "built by stable_models":
        assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path)) is arch.stock_class


def test_register_is_idempotent_and_undone(tmp_path):
    arch = BY_NAME["gemma2"]
    make_models(arch)[1].save_pretrained(tmp_path)  # a stock checkpoint, as an existing script would load
    stable_models.register()
    stable_models.register()
    try:
        model = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
        assert type(model) is arch.stable_class
        assert AutoModelForSequenceClassification.from_config(model.config).__class__ is arch.stable_class
    finally:
        stable_models.unregister()
    stable_models.unregister()
    assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path)) is arch.stock_class


def test_model_card_is_written_once_and_warns_about_trust_remote_code(tmp_path):
    arch = BY_NAME["qwen2"]
    stable, _ = make_models(arch)
    stable.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "trust_remote_code=True" in card and "silently loads the stock `Qwen2ForSequenceClassification`" in card
    (tmp_path / "README.md").write_text("my own card")
    stable.save_pretrained(tmp_path)
    assert (tmp_path / "README.md").read_text() == "my own card"


def lora_model(arch, seed=0):
    from peft import LoraConfig, get_peft_model

    stable, _ = make_models(arch, seed=seed)
    return get_peft_model(stable, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=LORA_TARGETS))


@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_peft_adapter_and_merged_round_trips(arch, tmp_path):
    from peft import PeftModel

    model = lora_model(arch)
    ids, mask = pad_batch(random_sequences([6, 3, 4]), "left")
    labels = torch.tensor([0, 1, 2])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path / "adapter")
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    head = [k for k in saved if "score" in k]
    assert head and all(saved[k].dtype == torch.float32 for k in head)

    fresh_base, _ = make_models(arch)
    reloaded = PeftModel.from_pretrained(fresh_base, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids, attention_mask=mask).logits, expected)
    assert all(p.dtype == torch.float32 for n, p in reloaded.named_parameters() if "score" in n)

    merged = reloaded.merge_and_unload()
    assert type(merged) is arch.stable_class and merged.score.weight.dtype == torch.float32
    with torch.no_grad():
        merged_logits = merged(input_ids=ids, attention_mask=mask).logits
    assert (merged_logits - expected).abs().max() <= 1e-5  # W + BA rounds differently from W x + B(A x)
    merged.save_pretrained(tmp_path / "merged")
    auto = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "merged", trust_remote_code=True, attn_implementation="eager"
    ).eval()
    with torch.no_grad():  # MoE: from_pretrained picks the grouped_mm expert kernel, which rounds differently
        assert (auto(input_ids=ids, attention_mask=mask).logits - merged_logits).abs().max() <= 1e-6


def trainer_for(arch, output_dir, stock=False):
    args = cpu_training_args(
        output_dir,
        per_device_train_batch_size=4,
        max_steps=6,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=3,
        lr_scheduler_type="linear",
    )
    return Trainer(
        model=make_models(arch)[1 if stock else 0],
        args=args,
        train_dataset=toy_dataset([3 + i % 6 for i in range(16)], seed=5),
        data_collator=collate_left,
    )


def resumed_losses(arch, output_dir, stock=False):
    """Train 6 steps saving at step 3, then resume from step 3: (straight losses, resumed losses of steps 4-6)."""
    straight = trainer_for(arch, output_dir, stock)
    straight.train()
    resumed = trainer_for(arch, output_dir, stock)
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-3"))
    logged = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (straight, resumed)]
    return logged[0], logged[1][-3:]


@pytest.mark.trains
@pytest.mark.parametrize("arch", FIRST_CLASS, ids=str)
def test_trainer_checkpoints_load_and_resume(arch, tmp_path):
    losses, resumed = resumed_losses(arch, tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoint-3"
    loaded = AutoModelForSequenceClassification.from_pretrained(checkpoint, trust_remote_code=True)
    assert type(loaded).__name__ == arch.stable_class.__name__
    stable_models.check_checkpoint(str(checkpoint))
    assert len(losses) == 6
    saved_keys = set(load_file(checkpoint / "model.safetensors"))
    if saved_keys == set(loaded.state_dict()):
        assert resumed == pytest.approx(losses[3:], rel=1e-5)
    else:
        # transformers 5 saves MoE experts / multimodal weights under legacy names, and Trainer's resume loads them
        # with a plain load_state_dict that skips those names: the stock class resumes from partly fresh weights
        # too. Drop-in means the same behaviour as the stock class.
        stock_losses, stock_resumed = resumed_losses(arch, tmp_path / "stock", stock=True)
        assert losses == pytest.approx(stock_losses, rel=1e-5)
        assert resumed == pytest.approx(stock_resumed, rel=1e-5)


@pytest.fixture
def saved_folder(tmp_path):
    stable, _ = make_models(BY_NAME["qwen2"])
    stable.save_pretrained(tmp_path)
    return tmp_path


def test_missing_weights(saved_folder):
    (saved_folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no weights \(model.safetensors.*Copy the weights next to config.json"):
        BY_NAME["qwen2"].stable_class.from_pretrained(saved_folder)


def test_truncated_safetensors(saved_folder):
    weights = saved_folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model.safetensors: \d+ bytes, but its tensors need \d+.*truncated"):
        BY_NAME["qwen2"].stable_class.from_pretrained(saved_folder)
    with pytest.raises(ValueError, match="truncated"):
        AutoModelForSequenceClassification.from_pretrained(saved_folder, trust_remote_code=True)


def test_garbage_safetensors(saved_folder):
    (saved_folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match=r"model.safetensors: header of \d+ bytes does not fit"):
        BY_NAME["qwen2"].stable_class.from_pretrained(saved_folder)


def test_config_without_auto_map(saved_folder):
    config = json.loads((saved_folder / "config.json").read_text())
    del config["auto_map"]
    (saved_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"config.json: no auto_map.*would silently load the stock class.*save_pretrained"
    ):
        stable_models.check_checkpoint(str(saved_folder))
    # the explicit class still loads it, and saving again restores auto_map
    model = BY_NAME["qwen2"].stable_class.from_pretrained(saved_folder)
    model.save_pretrained(saved_folder)
    stable_models.check_checkpoint(str(saved_folder))


@pytest.mark.parametrize("name", ["modeling_stable.py", "modeling_masks.py"])
def test_missing_code_file(saved_folder, name):
    """The class's file, or a core sibling it imports: either one missing is named."""
    (saved_folder / name).unlink()
    with pytest.raises(ValueError, match=rf"{name}: missing: auto_map needs this code file"):
        stable_models.check_checkpoint(str(saved_folder))


def test_unknown_pooling_value(saved_folder):
    config = json.loads((saved_folder / "config.json").read_text())
    config["classifier_pooling"] = "cls"
    (saved_folder / "config.json").write_text(json.dumps(config))
    message = r"config.json: classifier_pooling='cls' is not one of \('last', 'mean'\)"
    with pytest.raises(ValueError, match=message):
        BY_NAME["qwen2"].stable_class.from_pretrained(saved_folder)
    with pytest.raises(ValueError, match=message):
        AutoModelForSequenceClassification.from_pretrained(saved_folder, trust_remote_code=True)
    assert (
        BY_NAME["qwen2"].stable_class.from_pretrained(saved_folder, pooling="mean").config.classifier_pooling == "mean"
    )


def test_stable_models_from_pretrained_takes_an_adapter_folder(tmp_path):
    """An adapter folder (adapter_config.json, no config.json) loads its base, the saved head's num_labels and the
    adapter; a base that cannot be found is a clear error, not transformers' 'Unrecognized model'."""
    from peft import LoraConfig, get_peft_model

    arch = BY_NAME["qwen2"]
    torch.manual_seed(0)
    arch.causal_lm_class(make_config(arch)).save_pretrained(tmp_path / "base")
    base = arch.stable_class.from_pretrained(tmp_path / "base", num_labels=4)
    model = get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=LORA_TARGETS))
    with torch.no_grad():
        model.base_model.model.score.modules_to_save["default"].weight.normal_()  # a trained head, not the init
    model.save_pretrained(tmp_path / "adapter")
    ids, mask = pad_batch(random_sequences([6, 3]), "left")
    with torch.no_grad():
        expected = model.eval()(input_ids=ids, attention_mask=mask).logits
        loaded = stable_models.from_pretrained(tmp_path / "adapter", merge=False).eval()
        assert type(loaded.base_model.model) is arch.stable_class
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits, expected)
        merged = stable_models.from_pretrained(tmp_path / "adapter").eval()  # as predict scores it
        assert type(merged) is arch.stable_class
        torch.testing.assert_close(merged(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=0)

    config_path = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"the adapter's base model .*gone.* cannot be loaded here.*PeftModel"):
        stable_models.from_pretrained(tmp_path / "adapter")
