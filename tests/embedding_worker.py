"""Trainer run used by test_embedding_training.py: `python embedding_worker.py OUT --batch 16 [--accumulate 4]` or
`torchrun --nproc_per_node 2 embedding_worker.py OUT --batch 8 [--zero3 | --fsdp]` (`--checkpointing`: activation
checkpointing on): a tiny Qwen2 embedder trained 4 steps by EmbeddingTrainer (InfoNCE over the global batch, cached per
micro-batch) on query / positive / hard-negative rows in dataset order, with one positive repeated (a false negative
for the other query). Writes the logged losses, grad norms, false-negative counts and a weight checksum (rank 0).

`--fsdp`: Trainer runs FSDP only on GPUs, so on gloo the model is sharded with torch's `fully_shard` (FSDP2) and the
trainer's own step (`cache_step`, then `compute_loss` per micro-batch) runs in Trainer's order: cache, forward and
backward each micro-batch, clip to `max_grad_norm`, SGD step."""

import argparse
import contextlib
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from architectures import BY_NAME, cpu_training_args, make_config  # noqa: E402
from distributed import leave_process_group  # noqa: E402

from stable_models.cli.fine_tuning import checkpointing_arguments  # noqa: E402
from stable_models.embedding_training import EmbeddingCollator, EmbeddingTrainer  # noqa: E402
from stable_models.losses import InfoNCELoss  # noqa: E402
from stable_models.registry import embedding_class_for  # noqa: E402


class Pad:
    """A tokenizer's `pad` for id lists (right padding, pad id 0): all the collator asks of a tokenizer."""

    pad_token_id = 0

    def pad(self, features, padding=True, return_tensors="pt"):
        ids = features["input_ids"]
        width = max(len(i) for i in ids)
        return {
            "input_ids": torch.tensor([list(i) + [0] * (width - len(i)) for i in ids]),
            "attention_mask": torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids]),
        }


class SequentialTrainer(EmbeddingTrainer):
    def _get_train_sampler(self, *args, **kwargs):
        return torch.utils.data.SequentialSampler(self.train_dataset)


class MicroBatchTrainer(SequentialTrainer):
    """What cached gradients replace: each micro-batch's queries against its own candidates only, averaged."""

    def _get_num_items_in_batch(self, batch_samples, device):
        self.false_negatives = 0
        return None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from stable_models.embedding_training import global_batch, local_rows

        vectors = self.vectors(model, inputs)
        part = [(vectors, int(inputs["queries"]), inputs["negatives"].tolist(), inputs["hashes"])]
        queries, candidates, positive_index, hashes, _ = global_batch([local_rows(part, keep_graph=True)])
        masked = self.loss.false_negatives(hashes, positive_index)
        return self.loss(queries, candidates, positive_index, masked) / self.args.gradient_accumulation_steps


ZERO3 = {  # Trainer fills the "auto" values from its arguments; its own SGD runs under DeepSpeed
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 3},
    "zero_allow_untested_optimizer": True,
}


def gathered(model, zero3: bool):
    if not zero3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()))


def fsdp_run(trainer, batch: int) -> dict:
    """Trainer's optimizer step, by hand, on an FSDP2 model: each rank's micro-batch of the global batch of
    2 x `batch` rows (rank r its r-th slice, as Trainer's sharded loader gives), the cache over both, the replayed
    forward and backward (FSDP2 reduce-scatters the mean gradient), the clip and the step."""
    from torch.distributed.fsdp import fully_shard

    model, args = trainer.model, trainer.args
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    collate, data, world, rank = trainer.data_collator, rows(), args.world_size, args.process_index
    losses, norms, false_negatives = [], [], []
    for step in range(args.max_steps):
        start = step * batch * world + rank * batch
        inputs = collate(data[start : start + batch])
        trainer.cache_step([inputs], torch.device("cpu"))
        model.train()
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        norms.append(norm.full_tensor().item() if hasattr(norm, "full_tensor") else norm.item())
        false_negatives.append(trainer.false_negatives)
    weights = sum(
        (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().abs().sum().item()
        for p in model.parameters()
    )
    sharded = all(hasattr(p, "full_tensor") for p in model.parameters())
    return {
        "losses": losses,
        "grad_norms": norms,
        "false_negatives": false_negatives,
        "weights": weights,
        "world": world,
        "sharded": sharded,
    }


def rows(count=64):
    generator = torch.Generator().manual_seed(3)

    def text(n):
        return torch.randint(3, 90, (n,), generator=generator).tolist()

    out = [
        {"query_input_ids": text(3 + i % 5), "positive_input_ids": text(4 + i % 7), "negative_input_ids": [text(5)]}
        for i in range(count)
    ]
    for i in range(0, count, 16):  # in every step, two queries share a positive: each is the other's false negative
        out[i + 10]["positive_input_ids"] = list(out[i + 2]["positive_input_ids"])  # other process, other micro-batch
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--micro-batch-negatives", action="store_true", help="no cache: negatives of the micro-batch")
    parser.add_argument("--zero3", action="store_true", help="DeepSpeed ZeRO-3 (Trainer's own integration)")
    parser.add_argument("--packed", action="store_true", help="texts packed end to end, no padding")
    parser.add_argument("--fsdp", action="store_true", help="torch's fully_shard (FSDP2), Trainer's step by hand")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing (as train's flag)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = embedding_class_for("qwen2")(make_config(BY_NAME["qwen2"]))
    training = cpu_training_args(
        os.path.join(os.path.dirname(args.out), "trainer"),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accumulate,
        max_steps=4,
        learning_rate=1e-1,
        optim="sgd",
        lr_scheduler_type="constant",
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_timeout=120,
        deepspeed=ZERO3 if args.zero3 else None,
        **checkpointing_arguments(transformers.TrainingArguments, args.checkpointing, {"use_reentrant": False}),
    )
    trainer = (MicroBatchTrainer if args.micro_batch_negatives else SequentialTrainer)(
        model=model,
        args=training,
        train_dataset=rows(),
        data_collator=EmbeddingCollator(Pad(), packing=args.packed),
        loss=InfoNCELoss(temperature=0.1),
    )
    if args.fsdp:
        result = fsdp_run(trainer, args.batch)
        if trainer.is_world_process_zero():
            with open(args.out, "w") as handle:
                json.dump(result, handle)
        leave_process_group()
        return
    trainer.train()
    with gathered(trainer.model, args.zero3):  # every rank takes part; rank 0 sums the whole weights
        weights = sum(p.detach().double().abs().sum().item() for p in trainer.model.parameters())
    if trainer.is_world_process_zero():
        logged = [e for e in trainer.state.log_history if "loss" in e]
        result = {
            "losses": [e["loss"] for e in logged],
            "grad_norms": [e["grad_norm"] for e in logged],
            "false_negatives": [e["false_negatives"] for e in logged],
            "weights": weights,
            "world": trainer.args.world_size,
            "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else 0,
        }
        with open(args.out, "w") as handle:
            json.dump(result, handle)
    if torch.distributed.is_initialized():
        leave_process_group()


if __name__ == "__main__":
    main()
