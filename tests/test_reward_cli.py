"""`stable-models train / evaluate / predict` on preference data: TRL's layouts rendered as TRL renders them, the
Bradley-Terry loss with margins and centering as TRL computes it, exact under packing, gradient accumulation and
processes, the bad rows, pairwise evaluation, rewards out, and the stock class's pooling error with pad == eos."""

import json
import math

import pytest
import torch
from test_doctor import QLORA_SIZES, save_checkpoint
from tiny_tokenizers import qwen2_like
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import stable_models
from stable_models import cli
from stable_models.cli.preference_data import encoded_pairs, preference_layout
from stable_models.metrics import pairwise_metrics

datasets = pytest.importorskip("datasets")

GOOD_WORDS = ["great", "good", "loved", "fine"]
BAD_WORDS = ["awful", "bad", "dull", "hated"]
# Llama-3 style: every message ends with the end-of-turn token, which is also eos and (as TRL's example sets) pad
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} {{ message['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
FAST = ["--max-steps", "6", "--eval-steps", "3", "--batch-size", "4", "--lr", "5e-3", "--early-stopping", "0"]


def chat_tokenizer():
    tokenizer = qwen2_like()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("base"), "qwen2", chat_tokenizer())


def answer(i, good):
    words = GOOD_WORDS if good else BAD_WORDS
    return " ".join(["the film was"] + [words[(i + k) % 4] for k in range(1 + i % 3)])


def question(i):
    return ["is the film good", "was the plot fine", "did i like it"][i % 3]


def pairs(layout, count=24):
    """Preference rows in one of TRL's layouts: the good answer is chosen."""
    out = []
    for i in range(count):
        chosen, rejected, prompt = answer(i, True), answer(i + 1, False), question(i)
        if layout == "implicit":
            row = {"chosen": f"{prompt} {chosen}", "rejected": f"{prompt} {rejected}"}
        elif layout == "explicit":
            row = {"prompt": f"{prompt} ", "chosen": chosen, "rejected": rejected}
        elif layout == "conversational-implicit":
            user = {"role": "user", "content": prompt}
            row = {
                "chosen": [user, {"role": "assistant", "content": chosen}],
                "rejected": [user, {"role": "assistant", "content": rejected}],
            }
        else:  # conversational-explicit
            row = {
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        out.append(row)
    return out


def write(path, table):
    path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


def run(*args):
    return cli.main([str(a) for a in args])


LAYOUTS = ["implicit", "explicit", "conversational-implicit", "conversational-explicit"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_trl_layout_is_rendered_as_trl_renders_it(layout, base):
    """The token ids of each response equal those of TRL's RewardTrainer for the same rows and tokenizer."""
    trl = pytest.importorskip("trl")
    from trl.trainer.reward_trainer import RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(base)
    table = datasets.Dataset.from_list(pairs(layout, 6))
    ours, dropped = encoded_pairs(table, tokenizer, preference_layout(table, "rows"), 10**9)
    config = trl.RewardConfig(output_dir="unused", report_to=[], use_cpu=True, bf16=False, max_length=None)
    theirs = RewardTrainer._prepare_dataset(None, table, tokenizer, config, "train")
    assert dropped == 0 and ours["chosen_input_ids"] == theirs["chosen_ids"]
    assert ours["rejected_input_ids"] == theirs["rejected_ids"]
    assert all(ids[-1] == tokenizer.eos_token_id for ids in ours["chosen_input_ids"])  # the token the reward reads


@pytest.fixture(scope="module")
def reward_model(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("reward")
    data = write(folder / "train.jsonl", pairs("conversational-explicit", 32))
    output = folder / "model"
    assert run("train", "--model", base, "--train", data, "--output", output, "--dtype", "fp32", *FAST) == 0
    return output, data


def test_train_saves_a_reward_model_that_loads_without_the_library(reward_model):
    folder, _ = reward_model
    config = json.loads((folder / "config.json").read_text())
    assert config["num_labels"] == 1 if "num_labels" in config else len(config["id2label"]) == 1
    assert config["id2label"] == {"0": "reward"}
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__ == "StableQwen2ForSequenceClassification"
    metrics = json.loads((folder / "eval_metrics.json").read_text())
    assert 0 <= metrics["accuracy"] <= 1 and math.isfinite(metrics["margin_mean"])
    assert "reward model" in (folder / "README.md").read_text()


def test_margin_and_centering_are_trls_formula_and_exact_under_accumulation():
    """bradley_terry_loss against TRL's RewardTrainer.compute_loss formula, whole and split into micro-batches."""
    torch.manual_seed(0)
    chosen, rejected, margin = torch.randn(8), torch.randn(8), torch.rand(8)
    # TRL 1.16, RewardTrainer.compute_loss
    trl_loss = -torch.nn.functional.logsigmoid(chosen - rejected - margin).mean()
    trl_loss += 0.01 * torch.mean((chosen + rejected) ** 2)
    logits = torch.stack([chosen, rejected], 1).reshape(-1, 1)  # chosen_0, rejected_0, ...
    labels = torch.tensor([1, 0] * 8)
    whole = stable_models.bradley_terry_loss({"logits": logits}, labels, margin=margin, center_rewards=0.01)
    assert whole == pytest.approx(trl_loss.item(), rel=1e-6)
    parts = sum(
        stable_models.bradley_terry_loss(
            {"logits": logits[4 * i : 4 * i + 4]}, labels[4 * i : 4 * i + 4], 16, margin[2 * i : 2 * i + 2], 0.01
        )
        for i in range(4)
    )
    assert parts == pytest.approx(trl_loss.item(), rel=1e-6)


def losses(folder):
    return [e["loss"] for e in json.loads((folder / "training_log.json").read_text()) if "loss" in e]


def test_packing_accumulation_margin_and_centering_train_like_one_padded_batch(base, tmp_path):
    """The same 4 steps: packed batches of 8 pairs, padded batches, and 4 accumulated micro-batches of 2 pairs, with
    a margin column and --center-rewards: the loss histories agree."""
    rows = pairs("explicit", 40)
    for i, row in enumerate(rows):
        row["margin"] = (i % 3) / 2
    data = write(tmp_path / "train.jsonl", rows)
    common = ["--model", base, "--train", data, "--dtype", "fp32", "--max-steps", "4", "--eval-steps", "4"]
    common += ["--lr", "1e-2", "--early-stopping", "0", "--center-rewards", "0.05", "--full", "--warmup-ratio", "0"]
    runs = {
        "packed": ["--batch-size", "8"],
        "padded": ["--batch-size", "8", "--no-packing"],
        "accumulated": ["--batch-size", "2", "--grad-accum", "4"],
    }
    for name, extra in runs.items():
        assert run("train", *common, *extra, "--output", tmp_path / name) == 0
    history = {name: losses(tmp_path / name) for name in runs}
    assert len(history["packed"]) == 4 and all(math.isfinite(v) for v in history["packed"])
    assert history["padded"] == pytest.approx(history["packed"], rel=1e-5)
    assert history["accumulated"] == pytest.approx(history["packed"], rel=1e-5)


def bad_rows(case):
    rows = pairs("conversational-implicit", 6) if case.startswith("chat") else pairs("explicit", 6)
    if case == "empty side":
        rows[3]["rejected"] = "  "
    elif case == "missing side":
        rows[2]["chosen"] = None
    elif case == "chat no assistant turn":
        rows[4]["chosen"] = rows[4]["chosen"][:1]
    elif case == "chat prompts differ":
        rows[1]["rejected"][0] = {"role": "user", "content": "another question"}
    elif case == "chat empty response":
        rows[5]["rejected"][-1]["content"] = ""
    elif case == "margin nan":
        for row in rows:
            row["margin"] = 1.0
        rows[2]["margin"] = float("nan")
    elif case == "mixed kinds":
        for row in rows:
            row["chosen"] = [{"role": "assistant", "content": row["chosen"]}]
    return rows


BAD = {
    "empty side": ("'rejected' is empty in 1 row(s), first at row 4", "both responses"),
    "missing side": ("'chosen' is missing in 1 row(s), first at row 3", "fill or drop"),
    "chat no assistant turn": ("no final assistant turn in 1 pair(s), first at row 5", "must end with the assistant"),
    "chat prompts differ": ("prompts differ in 1 pair(s), first at row 2", "'prompt' column"),
    "chat empty response": ("empty in 1 pair(s), first at row 6", "both responses"),
    "margin nan": ("'margin' is missing or NaN in 1 row(s), first at row 3", "fill or drop"),
    "mixed kinds": ("mix texts and conversations", "one kind"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_preference_rows_are_one_line_errors(case, base, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in bad_rows(case)).replace("NaN", "NaN"))
    output = tmp_path / "out"
    assert run("train", "--model", base, "--train", data, "--output", output, *FAST) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and all(part in error for part in BAD[case]), error
    assert not output.exists()


def test_identical_pairs_warn_with_a_count_and_a_forced_task_names_the_columns(base, tmp_path, capsys):
    from stable_models.cli.preference import read_pairs

    rows = pairs("implicit", 6)
    rows[1]["rejected"] = rows[1]["chosen"]
    rows[4]["rejected"] = rows[4]["chosen"]
    table = datasets.Dataset.from_list(rows)
    said = []
    read_pairs(table, "pairs.jsonl", lambda *parts, **_: said.append(" ".join(parts)))
    assert len(said) == 1 and "chosen equals rejected in 2 pair(s)" in said[0]
    plain = write(tmp_path / "plain.jsonl", [{"text": "good film", "label": "pos"}] * 4)
    assert run("train", "--model", base, "--train", plain, "--output", tmp_path / "o", "--task", "preference") == 2
    assert "no column 'chosen'" in capsys.readouterr().err


def test_a_conversational_file_needs_a_chat_template(tmp_path, capsys):
    tokenizer = qwen2_like()  # no chat template
    plain_base = save_checkpoint(tmp_path / "base", "qwen2", tokenizer)
    data = write(tmp_path / "pairs.jsonl", pairs("conversational-explicit", 6))
    assert run("train", "--model", plain_base, "--train", data, "--output", tmp_path / "out", *FAST) == 2
    error = capsys.readouterr().err
    assert "has no chat template" in error and "tokenizer.chat_template" in error


def rewards_of(folder, ids):
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([i])).logits[:, 0] for i in ids]).double()


def test_evaluate_reports_pairwise_metrics_subsets_and_calibrates(reward_model, base, tmp_path, capsys):
    folder, _ = reward_model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = pairs("conversational-explicit", 12)
    for i, row in enumerate(rows):
        row["subset"] = ["alpacaeval-easy", "mt-bench-hard", "donotanswer", "my-own"][i % 4]
    data = write(tmp_path / "test.jsonl", rows)
    table = datasets.Dataset.from_list(rows)
    encoded, _ = encoded_pairs(table, tokenizer, preference_layout(table, "t"), 10**9)
    chosen = rewards_of(folder, encoded["chosen_input_ids"])
    rejected = rewards_of(folder, encoded["rejected_input_ids"])
    copy = tmp_path / "model"
    import shutil

    shutil.copytree(folder, copy)
    assert run("evaluate", "--model", copy, "--data", data, "--report-dir", tmp_path / "report") == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    expected = pairwise_metrics(chosen, rejected, table["subset"])
    assert report["accuracy"] == pytest.approx(((chosen - rejected) > 0).double().mean().item())
    assert report["margin_mean"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-5)
    assert report["per_subset"]["my-own"]["pairs"] == 3
    assert set(report["rewardbench_sections"]) == {"Chat", "Chat Hard", "Safety"}
    assert report["rewardbench_score"] == pytest.approx(expected["rewardbench_score"], abs=1e-6)
    assert {"rewards.png", "reliability.png"} <= {p.split("/")[-1] for p in report["plots"]}
    assert "RewardBench" in capsys.readouterr().out
    assert run("evaluate", "--model", copy, "--data", data, "--report-dir", tmp_path / "r2", "--calibrate") == 0
    fitted = json.loads((tmp_path / "r2" / "report.json").read_text())["calibration"]
    after_chosen = rewards_of(copy, encoded["chosen_input_ids"])
    assert fitted["nll_after"] <= fitted["nll_before"] + 1e-9
    assert after_chosen == pytest.approx((chosen / fitted["temperature"]).tolist(), abs=1e-5)


def test_rewards_sections_weigh_subsets_by_rewardbench_counts():
    chosen, rejected = torch.tensor([1.0, 1.0, -1.0, 1.0]), torch.zeros(4)
    report = pairwise_metrics(chosen, rejected, ["math-prm", "math-prm", "hep-go", "hep-go"])
    # math-prm 984 (upweighted), hep-go 164: (1.0 * 984 + 0.5 * 164) / 1148
    assert report["rewardbench_sections"] == {"Reasoning": pytest.approx((984 + 82) / 1148)}
    assert report["accuracy"] == 0.75 and report["ties"] == 0


def test_predict_writes_rewards_winners_and_ranks(reward_model, tmp_path):
    folder, _ = reward_model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = pairs("conversational-explicit", 5)
    data = write(tmp_path / "pairs.jsonl", rows)
    assert run("predict", "--model", folder, "--data", data, "--output", tmp_path / "pairs.out.jsonl") == 0
    out = [json.loads(line) for line in open(tmp_path / "pairs.out.jsonl")]
    table = datasets.Dataset.from_list(rows)
    encoded, _ = encoded_pairs(table, tokenizer, preference_layout(table, "t"), 10**9)
    chosen = rewards_of(folder, encoded["chosen_input_ids"])
    assert [r["reward_chosen"] for r in out] == pytest.approx(chosen.tolist(), abs=1e-5)
    assert all(r["preferred"] == ("chosen" if r["reward_chosen"] > r["reward_rejected"] else "rejected") for r in out)
    assert [r["chosen"] for r in out] == [r["chosen"] for r in rows]
    # best-of-n: 3 answers to each of 2 prompts, ranked within their prompt
    responses = [
        {
            "prompt": [{"role": "user", "content": question(q)}],
            "messages": [{"role": "assistant", "content": answer(k, k != 1)}],
            "prompt_id": q,
        }
        for q in range(2)
        for k in range(3)
    ]
    data = write(tmp_path / "n.jsonl", responses)
    assert (
        run("predict", "--model", folder, "--data", data, "--output", tmp_path / "n.csv", "--group-key", "prompt_id")
        == 0
    )
    import pandas

    scored = pandas.read_csv(tmp_path / "n.csv")
    ids = [
        tokenizer.apply_chat_template(r["prompt"] + r["messages"], tokenize=True, return_dict=True)["input_ids"]
        for r in responses
    ]
    assert scored["reward"].tolist() == pytest.approx(rewards_of(folder, ids).tolist(), abs=1e-5)
    for _, group in scored.groupby("prompt_id"):
        assert group.sort_values("reward", ascending=False)["rank"].tolist() == [1, 2, 3]


def test_the_command_trains_as_trls_reward_trainer_and_the_stock_class_reads_the_wrong_token(tmp_path):
    """pad == eos, a chat template that ends every turn with eos, one classifier folder to start from. The command
    and TRL's RewardTrainer with the Stable class, same pairs, hyperparameters and full batches (so the order does
    not matter), give the same held-out rewards; RewardTrainer with the stock class pools the token before the eos."""
    trl = pytest.importorskip("trl")
    tokenizer = chat_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token  # as TRL's reward example sets it
    causal = save_checkpoint(tmp_path / "causal", "qwen2", tokenizer)
    torch.manual_seed(0)
    start = tmp_path / "start"
    stable_models.from_pretrained(causal, num_labels=1, id2label={0: "reward"}, label2id={"reward": 0}).save_pretrained(
        start
    )
    tokenizer.save_pretrained(start)
    train_rows, held_out = pairs("conversational-implicit", 8), pairs("conversational-explicit", 6)
    train, test = write(tmp_path / "train.jsonl", train_rows), write(tmp_path / "test.jsonl", held_out)
    steps, lr = 3, 1e-3
    assert (
        run(
            "train",
            "--model",
            start,
            "--train",
            train,
            "--eval",
            test,
            "--output",
            tmp_path / "command",
            "--full",
            "--dtype",
            "fp32",
            "--batch-size",
            8,
            "--max-steps",
            steps,
            "--eval-steps",
            steps,
            "--lr",
            lr,
            "--warmup-ratio",
            0,
            "--early-stopping",
            0,
        )
        == 0
    )
    trained = {"command": tmp_path / "command"}
    for name, loader in (
        ("trl-stable", stable_models.from_pretrained),
        ("trl-stock", AutoModelForSequenceClassification.from_pretrained),
    ):
        model = loader(start)
        config = trl.RewardConfig(
            output_dir=str(tmp_path / name),
            per_device_train_batch_size=8,
            max_steps=steps,
            learning_rate=lr,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
        )
        trainer = trl.RewardTrainer(
            model=model,
            args=config,
            processing_class=AutoTokenizer.from_pretrained(start),
            train_dataset=datasets.Dataset.from_list(train_rows),
        )
        trainer.train()
        trained[name] = model.eval()
    table = datasets.Dataset.from_list(held_out)
    ids = encoded_pairs(table, AutoTokenizer.from_pretrained(start), preference_layout(table, "t"), 10**9)[0]
    ids = list(ids["chosen_input_ids"]) + list(ids["rejected_input_ids"])
    assert all(i[-1] == tokenizer.eos_token_id for i in ids)
    batch = AutoTokenizer.from_pretrained(start).pad({"input_ids": ids}, return_tensors="pt")
    with torch.no_grad():
        command = rewards_of(trained["command"], ids)
        trl_stable = trained["trl-stable"](**batch).logits[:, 0].double()
        stock = trained["trl-stock"](**batch).logits[:, 0].double()
        # the stock class reads the token before the eos: its reward is the one of the response without its eos
        stock_without_eos = torch.cat(
            [trained["trl-stock"](input_ids=torch.tensor([i[:-1]])).logits[:, 0] for i in ids]
        ).double()
    assert (command - rewards_of(start, ids)).abs().max() > 1e-1  # training moved the rewards ...
    assert (command - trl_stable).abs().max() <= 1e-5  # ... alike (measured 2.7e-07)
    assert (stock - stock_without_eos).abs().max() <= 1e-5
    assert (stock - trl_stable).abs().max() > 1e-2  # trained on other tokens: other rewards


def test_the_readme_reward_commands_run_as_written(base, tmp_path, monkeypatch):
    import shlex

    from documented import commands

    lines = commands("--group-key")
    assert [line.split()[1] for line in lines] == ["train", "evaluate", "predict"]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "pairs.jsonl", pairs("conversational-implicit", 24))
    write(tmp_path / "test_pairs.jsonl", pairs("conversational-explicit", 8))
    answers = [{"prompt": question(i // 3), "text": answer(i, i % 3 != 1)} for i in range(9)]
    write(tmp_path / "answers.jsonl", answers)
    for line in lines:
        assert cli.main(shlex.split(line.replace("./SmolLM2-135M-Instruct", str(base)))[1:]) == 0, line
    scored = [json.loads(line) for line in open("rewards.jsonl")]
    assert [r["text"] for r in scored] == [a["text"] for a in answers]
    assert sorted(r["rank"] for r in scored) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert json.loads(open("rm/evaluation/report.json").read())["calibration"]["temperature"] > 0


def test_a_failed_reward_predict_leaves_no_file(reward_model, tmp_path, monkeypatch):
    from stable_models.cli.outputs import PredictionWriter

    folder, _ = reward_model
    data = write(tmp_path / "pairs.jsonl", pairs("conversational-explicit", 3))
    real = PredictionWriter.write

    def fail_midway(self, rows):
        real(self, rows)
        raise KeyboardInterrupt

    monkeypatch.setattr(PredictionWriter, "write", fail_midway)
    output = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run("predict", "--model", folder, "--data", data, "--output", output)
    assert list(tmp_path.glob("out.jsonl*")) == []


def test_a_reward_run_keeps_the_best_pairwise_accuracy_and_resumes(base, tmp_path, monkeypatch):
    """The best checkpoint is chosen by pairwise accuracy (early stopping watches the same metric), and --resume
    continues from the last checkpoint."""
    data = write(tmp_path / "train.jsonl", pairs("explicit", 40))
    output = tmp_path / "rm"
    common = ["--model", base, "--train", data, "--output", output, "--dtype", "fp32", "--eval-steps", "2"]
    common += ["--batch-size", "4", "--lr", "5e-3", "--early-stopping", "2"]
    assert run("train", *common, "--max-steps", "4", "--keep-checkpoints") == 0
    state = json.loads(next((output / "checkpoints").glob("checkpoint-4")).joinpath("trainer_state.json").read_text())
    assert state["best_metric"] == max(e["eval_accuracy"] for e in state["log_history"] if "eval_accuracy" in e)
    from transformers import Trainer

    done, step = [], Trainer.training_step
    monkeypatch.setattr(Trainer, "training_step", lambda self, *a, **k: done.append(1) or step(self, *a, **k))
    assert run("train", *common, "--max-steps", "6", "--resume") == 0
    assert len(done) == 2  # steps 5 and 6: resumed from checkpoint-4, not started over
    steps = [e["step"] for e in json.loads((output / "training_log.json").read_text()) if "loss" in e]
    assert steps[-1] == 6


def test_a_qlora_reward_model_trains_4bit_and_saves_a_full_precision_reward_model(tmp_path):
    """--qlora on preference pairs: the pair trainer runs on the 4-bit base, and the folder is a plain reward model."""
    pytest.importorskip("bitsandbytes")
    from safetensors.torch import load_file

    tokenizer = chat_tokenizer()
    base = save_checkpoint(tmp_path / "base", "qwen2", tokenizer, **QLORA_SIZES)
    data = write(tmp_path / "train.jsonl", pairs("conversational-explicit", 32))
    output = tmp_path / "rm"
    assert run("train", "--model", base, "--train", data, "--output", output, "--qlora", *FAST) == 0
    saved = json.loads((output / "config.json").read_text())
    assert saved["id2label"] == {"0": "reward"} and "quantization_config" not in saved
    weights = load_file(output / "model.safetensors")
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)  # full precision, not packed 4-bit
    assert weights["score.weight"].shape == (1, 64) and not any("lora" in key for key in weights)
    log = json.loads((output / "training_log.json").read_text())
    losses = [entry["loss"] for entry in log if "loss" in entry and "train_runtime" not in entry]
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses)
    metrics = json.loads((output / "eval_metrics.json").read_text())
    assert 0 <= metrics["accuracy"] <= 1 and math.isfinite(metrics["margin_mean"])
    model = stable_models.from_pretrained(output)
    table = datasets.Dataset.from_list(pairs("conversational-explicit", 2))
    ids = encoded_pairs(table, tokenizer, preference_layout(table, "rows"), 10**9)[0]["chosen_input_ids"]
    with torch.no_grad():
        rewards = torch.cat([model(torch.tensor([row])).logits for row in ids])
    assert rewards.shape == (2, 1) and torch.isfinite(rewards).all()
