"""The tools people train and rank with (test extras), stock vs Stable on the same weights: TRL's RewardTrainer with
a tokenizer whose pad == eos (as most chat tokenizers ship), TRL's get_reward, sentence-transformers' CrossEncoder."""

import datasets
import tiny_tokenizers
import torch
import trl
from architectures import BY_NAME, make_models

LLAMA = BY_NAME["llama"]
CHOSEN = ["the film was great", "i loved it", "a fine plot", "very good actor", "not bad at all", "it was fine"]
REJECTED = ["the film was dull", "i hated it", "awful", "a bad plot and a bad actor", "not good", "very dull"]


def reward_models():
    tokenizer = tiny_tokenizers.llama_pad_is_eos()
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    stable, stock = make_models(LLAMA, num_labels=1, vocab_size=len(tokenizer), **ids)
    return stable, stock, tokenizer


def reward_trainer(model, tokenizer, tmp_path):
    args = trl.RewardConfig(
        str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        bf16=False,  # TRL's configs default to bf16 where supported (CPU too); fp32 here, and accelerate's
        # process-wide state would keep a bf16 setting for every later Trainer in this process
    )
    data = datasets.Dataset.from_dict({"chosen": CHOSEN, "rejected": REJECTED})
    return trl.RewardTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)


def test_reward_trainer_trains_and_rewards_equal_each_response_alone(tmp_path):
    stable, _, tokenizer = reward_models()
    trainer = reward_trainer(stable.train(), tokenizer, tmp_path)
    first = trainer.train_dataset[0]["chosen_ids"]
    assert first[-1] == tokenizer.eos_token_id  # TRL appends eos, which is also the pad token
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert stable.score.weight.dtype == torch.float32
    examples = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(examples)  # TRL's own padding: chosen then rejected, right-padded with eos
    stable.eval()
    with torch.no_grad():
        rewards = stable(**batch).logits.squeeze(-1)
        responses = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
        alone = torch.cat([stable(torch.tensor([r])).logits.squeeze(-1) for r in responses])
    torch.testing.assert_close(rewards, alone, atol=1e-5, rtol=0)


def test_with_pad_equal_to_eos_the_stock_reward_ignores_the_appended_eos():
    """TRL appends eos == pad: the stock class pools the token before it (it looks for the first pad id), so the
    eos a reward model is trained to read never reaches the head; the Stable class pools it (the mask says real)."""
    stable, stock, tokenizer = reward_models()
    text = tokenizer("the film was great")["input_ids"]
    with_eos = torch.tensor([text + [tokenizer.eos_token_id]])
    without = torch.tensor([text])
    with torch.no_grad():
        torch.testing.assert_close(stock(with_eos).logits, stock(without).logits)  # the eos changes nothing
        assert (stable(with_eos).logits - stable(without).logits).abs().max() > 1e-3
        hidden = stable.model(with_eos).last_hidden_state[:, -1]
        torch.testing.assert_close(stable(with_eos).logits, stable.score(hidden))  # the eos itself is pooled


def test_get_reward_scores_the_eos_where_trls_scores_the_token_before_it():
    """trl.experimental.utils.get_reward calls the backbone and model.score itself and finds the scored token by
    searching for pad_token_id; stable_models.get_reward is the same call through the forward."""
    from trl.experimental.utils import get_reward as trl_get_reward

    import stable_models

    stable, _, tokenizer = reward_models()
    pad = tokenizer.pad_token_id
    query = [5, 6, 7]  # the context, then responses that end in eos (== pad) and are right-padded
    responses = [[8, 9, pad], [10, pad, pad], [11, 12, 13]]  # the last one was cut before its eos
    batch = torch.tensor([query + r for r in responses])
    real_lengths = [len(query) + r.index(pad) + 1 if pad in r else len(query) + len(r) for r in responses]
    with torch.no_grad():
        alone = torch.cat([stable(batch[i : i + 1, :n]).logits.squeeze(-1) for i, n in enumerate(real_lengths)])
        _, ours, lengths = stable_models.get_reward(stable, batch, pad, len(query))
        _, theirs, trl_lengths = trl_get_reward(stable, batch, pad, len(query))
    torch.testing.assert_close(ours, alone, atol=1e-5, rtol=0)
    assert lengths.tolist() == [n - 1 for n in real_lengths]
    assert trl_lengths.tolist()[:2] == [n - 2 for n in real_lengths[:2]]  # the token before the eos
    assert (theirs[:2] - alone[:2]).abs().min() > 1e-3


PAIRS = [("the film was great", "a fine film"), ("bad", "the plot was thin"), ("i loved it", "very good")]


def test_cross_encoder_predicts_trains_and_reloads_as_the_stable_class(tmp_path):
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    tokenizer = tiny_tokenizers.qwen2_like()
    qwen2 = BY_NAME["qwen2"]
    model = make_models(qwen2, num_labels=1, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)[0]
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    encoder = CrossEncoder(str(tmp_path / "base"), trust_remote_code=True, device="cpu")
    assert type(encoder.model).__name__ == "StableQwen2ForSequenceClassification"
    batched = encoder.predict(PAIRS, batch_size=3, convert_to_tensor=True)
    alone = torch.cat([encoder.predict([p], batch_size=1, convert_to_tensor=True) for p in PAIRS])
    torch.testing.assert_close(batched, alone, atol=1e-6, rtol=0)

    data = datasets.Dataset.from_dict(
        {"sentence1": [a for a, _ in PAIRS] * 4, "sentence2": [b for _, b in PAIRS] * 4, "label": [1.0, 0.0, 1.0] * 4}
    )
    args = CrossEncoderTrainingArguments(
        str(tmp_path / "run"),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    before = encoder.model.score.weight.detach().clone()
    CrossEncoderTrainer(model=encoder, args=args, train_dataset=data, loss=BinaryCrossEntropyLoss(encoder)).train()
    assert encoder.model.score.weight.dtype == torch.float32 and not torch.equal(before, encoder.model.score.weight)

    encoder.save_pretrained(str(tmp_path / "trained"))
    reloaded = CrossEncoder(str(tmp_path / "trained"), trust_remote_code=True, device="cpu")
    assert type(reloaded.model).__name__ == "StableQwen2ForSequenceClassification"
    torch.testing.assert_close(
        reloaded.predict(PAIRS, batch_size=3, convert_to_tensor=True),
        encoder.predict(PAIRS, batch_size=3, convert_to_tensor=True),
    )


def test_qlora_4bit_keeps_score_an_unquantized_fp32_head_that_trains(tmp_path):
    """bitsandbytes 4-bit (CPU backend) + peft's prepare_model_for_kbit_training + LoRA SEQ_CLS."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    qwen2 = BY_NAME["qwen2"]
    make_models(qwen2, hidden_size=64, intermediate_size=128)[0].save_pretrained(tmp_path)  # bnb packs 64-wide rows
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    results = {}
    for kind, cls in (("stable", qwen2.stable_class), ("stock", qwen2.stock_class)):
        model = cls.from_pretrained(tmp_path, quantization_config=quantization, device_map="cpu")
        assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"  # really quantized
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"]))
        head = model.base_model.model.score.modules_to_save["default"]
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        ids, labels = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), torch.tensor([0, 2])
        before = head.weight.detach().clone()
        model.train()
        for _ in range(2):
            out = model(input_ids=ids, labels=labels)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        results[kind] = dict(
            head=head, logits=out.logits.dtype, loss=out.loss, moved=not torch.equal(before, head.weight)
        )
    stable = results["stable"]
    assert type(stable["head"]).__name__ == "Fp32Linear" and stable["head"].weight.dtype == torch.float32
    assert stable["logits"] == torch.float32 and torch.isfinite(stable["loss"]) and stable["moved"]
    # measured: on the CPU backend the stock head also stays fp32 (prepare_model_for_kbit_training upcasts the
    # unquantized parameters), so QLoRA shows no difference here; the test keeps that true for both
    stock = results["stock"]
    assert stock["head"].weight.dtype == torch.float32 and stock["logits"] == torch.float32 and stock["moved"]
