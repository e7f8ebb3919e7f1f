"""Trainer run used by test_ddp.py: `torchrun --nproc_per_node 2 ddp_worker.py OUT --batch 4 [--packing]` or
`python ddp_worker.py OUT --batch 8`; `--stock` trains the stock class, `--class-weights` the Stable one with
class weights and label smoothing. Writes the logged loss and grad-norm curves and
a weight checksum to OUT (rank 0)."""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from architectures import BY_NAME, collate_left, cpu_training_args, make_models, toy_dataset  # noqa: E402
from distributed import leave_process_group  # noqa: E402

from stable_models import PackedCollator, StableTrainer  # noqa: E402


class SequentialTrainer(StableTrainer):  # Trainer, plus the class-weight total across processes
    """Examples in dataset order, so one process with batch 2B sees what two processes with batch B see together."""

    def _get_train_sampler(self, *args, **kwargs):
        return torch.utils.data.SequentialSampler(self.train_dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=None, help="with --packing: rows of at most N tokens")
    parser.add_argument("--stock", action="store_true", help="train the stock class (same weights) instead")
    parser.add_argument("--class-weights", action="store_true", help="class_weights [1, 3, 0.25], label_smoothing 0.1")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = toy_dataset([3 + (7 * i) % 11 for i in range(32)], seed=6)
    model = make_models(BY_NAME["qwen2"])[1 if args.stock else 0]
    if args.class_weights:
        weighted = type(model)(model.config, class_weights=[1.0, 3.0, 0.25], label_smoothing=0.1)
        weighted.load_state_dict(model.state_dict())
        model = weighted
    training = cpu_training_args(
        os.path.join(os.path.dirname(args.out), "trainer"),
        per_device_train_batch_size=args.batch,
        max_steps=4,
        learning_rate=1e-2,
        optim="sgd",
        lr_scheduler_type="constant",
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_timeout=120,  # a lost peer fails the test in minutes, not after the default 30
    )
    trainer = SequentialTrainer(
        model=model,
        args=training,
        train_dataset=dataset,
        data_collator=PackedCollator(max_tokens=args.max_tokens) if args.packing else collate_left,
    )
    trainer.train()
    if trainer.is_world_process_zero():
        logged = [e for e in trainer.state.log_history if "loss" in e]
        weights = sum(p.detach().double().abs().sum().item() for p in model.parameters())
        result = {
            "losses": [e["loss"] for e in logged],
            "grad_norms": [e["grad_norm"] for e in logged],
            "weights": weights,
            "world": trainer.args.world_size,
        }
        with open(args.out, "w") as handle:
            json.dump(result, handle)
    if torch.distributed.is_initialized():
        leave_process_group()


if __name__ == "__main__":
    main()
