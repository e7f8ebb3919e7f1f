"""The fine-tuning set-up of `stable-models train`, the same for every task: the base model (4-bit with --qlora),
LoRA adapters, TrainingArguments (--deepspeed, --fsdp, evaluation and checkpoints), the Trainer with the task's
collator, loss and metrics (batches in Trainer's random order) and callbacks, and the merged model it saves.
commands.train runs these steps in order.
"""

import contextlib
import dataclasses
import importlib.util
import math
import os
from pathlib import Path

import torch

from .errors import CliError


def fast_dtype() -> str:
    """bf16 where its matmuls are fast (CUDA with bf16, CPUs with AVX512-BF16 / AMX), else fp32: on an AVX2-only CPU a
    bf16 matmul is ~95x slower than fp32."""
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "fp32"
    return "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def decoder_layer_linears(model) -> list[str]:
    """The names LoRA targets: every linear layer inside the decoder layers (attention and MLP; GPT-2's Conv1D
    included), for any architecture."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.pytorch_utils import Conv1D

    names = set()
    for layer in (m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)):
        names |= {n.split(".")[-1] for n, m in layer.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    if not names:
        raise CliError(f"{type(model).__name__}: no linear layers in its decoder layers for LoRA; pass --full")
    return sorted(names)


def load_base_model(args, load: dict, dtype: str, kind):
    """The task's kind of model (`model_kinds`) on --model: fp32, or 4-bit base weights with --qlora; a GGUF file
    dequantized."""
    import transformers

    quantized = dict(load)
    if args.qlora:
        compute = torch.bfloat16 if dtype == "bf16" else torch.float32
        quantized["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
        )
        quantized["device_map"] = "auto" if torch.cuda.is_available() else "cpu"
    try:
        model = kind.load(args.model, **quantized)
    except ValueError as error:
        raise CliError(f"--model {args.model}: {str(error).splitlines()[0]}") from None
    if args.gguf_file:  # dequantized on load: a plain fp32 model, saved without GGUF quantization settings
        model.hf_quantizer, model.is_quantized = None, False
        model.config.__dict__.pop("quantization_config", None)
    if args.qlora:
        keep_4bit_weights_trainable(model)
    return model


def keep_4bit_weights_trainable(model) -> None:
    """bitsandbytes (0.50) on CPUs with AVX512-BF16 repacks a 4-bit layer's weights for inference at its first no-grad
    forward (Trainer's evaluation) and keeps them so; the next training step then fails in that inference kernel
    ("a view of a leaf Variable ... in-place"). Training keeps the training layout: this model's layers skip it."""
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def with_adapters(model, args, kind):
    """LoRA on every linear layer of the decoder layers (after k-bit preparation with --qlora), with the peft task type
    that keeps the kind's head trainable; --full: unchanged."""
    if args.full:
        return model
    from peft import LoraConfig, get_peft_model

    if args.qlora:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    targets = [name.strip() for name in args.lora_target.split(",")] if args.lora_target else None
    lora = LoraConfig(
        task_type=kind.lora_task_type,
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=args.lora_dropout,
        target_modules=targets or decoder_layer_linears(model),
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as error:  # peft names the targets it did not find
        raise CliError(f"--lora-target {args.lora_target}: {str(error).splitlines()[0]}") from None


DEEPSPEED_STAGES = {"zero2": 2, "zero3": 3}


def deepspeed_config(value: str | None) -> dict | str | None:
    """--deepspeed: a built-in ZeRO-2 / ZeRO-3 config ("auto" values filled in by transformers from the command's
    own options), or the user's JSON file as it is."""
    if value is None:
        return None
    if value not in DEEPSPEED_STAGES:
        if not Path(value).is_file():
            raise CliError(f"--deepspeed {value}: neither zero2, zero3 nor a DeepSpeed JSON config file")
        return value
    if importlib.util.find_spec("deepspeed") is None:
        raise CliError(f"--deepspeed {value} needs DeepSpeed: pip install deepspeed")
    zero = {"stage": DEEPSPEED_STAGES[value], "overlap_comm": False}
    if value == "zero3":
        zero["stage3_gather_16bit_weights_on_model_save"] = True  # a saved model is whole, not 0-element tensors
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,  # transformers' AdamW, which also runs on CPU
        "zero_force_ds_cpu_optimizer": False,
    }


def fsdp_options(enabled: bool) -> dict:
    """--fsdp: FSDP full sharding of the decoder layers; transformers' Trainer runs FSDP on GPUs only."""
    if not enabled:
        return {}
    if not torch.cuda.is_available():
        raise CliError("--fsdp needs GPUs (transformers' Trainer runs FSDP on CUDA only); on CPU use --deepspeed zero3")
    return {"fsdp": "full_shard auto_wrap", "fsdp_config": {"use_orig_params": True}}


def trackers(args, logs: Path, run: str) -> list[str]:
    """--report-to: Trainer's own integrations, each logging under `logs` (offline for those that would need a
    service) unless the user's environment already says where; in-process, `cli.main` restores os.environ after."""
    chosen = [name for name in args.report_to if name != "none"]
    for name in chosen:
        if importlib.util.find_spec(name) is None:
            raise CliError(f"--report-to {name} needs {name}: pip install {name}")
    where = {
        "tensorboard": {"TENSORBOARD_LOGGING_DIR": str(logs / run)},  # transformers 5 (4.x: TrainingArguments)
        "wandb": {"WANDB_MODE": "offline", "WANDB_DIR": str(logs)},
        "mlflow": {"MLFLOW_TRACKING_URI": (logs / "mlruns").as_uri()},
        "trackio": {"TRACKIO_DIR": str(logs / "trackio")},
    }
    for name in chosen:
        for key, value in where[name].items():
            os.environ.setdefault(key, value)
    return chosen


def planned_steps(args, rows: int, world: int) -> int:
    """Optimizer steps of a run: --max-steps, or --epochs over `rows` at the batch of all processes."""
    return args.max_steps or math.ceil(math.ceil(rows / (args.batch_size * args.grad_accum * world)) * args.epochs)


def checkpointing_arguments(arguments_class, enabled: bool, kwargs: dict) -> dict:
    """Activation checkpointing under the name the installed TrainingArguments takes: transformers 5.25 renamed
    `gradient_checkpointing*` to `activation_checkpointing*` and warns on the old names at every run."""
    name = "activation_checkpointing"
    if name not in arguments_class.__dataclass_fields__:
        name = "gradient_checkpointing"
    return {name: enabled, f"{name}_kwargs": kwargs if enabled else None}


@dataclasses.dataclass(frozen=True)
class Cadence:
    """How often a run evaluates and saves (training_arguments takes it), and the line train prints about it."""

    steps: int
    line: str


def training_arguments(args, data, dtype: str, checkpoints: Path, cadence: Cadence):
    """TrainingArguments of a run: evaluation and checkpoints at the cadence (up to five times per run), the best
    restored at the end, and --deepspeed / --fsdp. Built once, before the model is loaded, so ZeRO-3 partitions it as
    it is built."""
    from transformers import TrainingArguments

    world = int(os.environ.get("WORLD_SIZE", "1"))
    total_steps = planned_steps(args, len(data.train), world)
    run = args.run_name or Path(args.output).resolve().name
    best_metric, greater_is_better = data.task.best_metric(data)
    if args.deepspeed and world > 1:
        import deepspeed

        deepspeed.init_distributed()  # DeepSpeed's view of the process group the Job opened (else: world size 1)
    return TrainingArguments(
        output_dir=str(checkpoints),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=2 * args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr or (2e-5 if args.full else 2e-4),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1,
        warmup_steps=int(total_steps * args.warmup_ratio) or (1 if args.warmup_ratio else 0),
        lr_scheduler_type=args.scheduler,
        weight_decay=args.weight_decay,
        # reentrant checkpointing (transformers 4.x's default) passes no gradient to LoRA: its inputs need none
        **checkpointing_arguments(TrainingArguments, args.gradient_checkpointing, {"use_reentrant": False}),
        eval_strategy="steps",
        eval_steps=cadence.steps,
        save_strategy="steps",
        save_steps=cadence.steps,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model=best_metric,
        greater_is_better=greater_is_better,
        logging_steps=max(1, min(cadence.steps, total_steps // 20)),
        seed=args.seed,
        bf16=dtype == "bf16",
        use_cpu=not torch.cuda.is_available(),
        report_to=trackers(args, checkpoints.parent.resolve() / "logs", run),
        run_name=run,
        remove_unused_columns=False,
        ddp_find_unused_parameters=False,  # train sets it from the pre-flight where a model needs it
        label_names=["labels"],
        disable_tqdm=False,
        deepspeed=deepspeed_config(args.deepspeed),
        **fsdp_options(args.fsdp),
        **({"logging_dir": os.environ["TENSORBOARD_LOGGING_DIR"]} if tensorboard_by_argument(args) else {}),
    )


def tensorboard_by_argument(args) -> bool:
    """transformers 4.x takes TensorBoard's folder as TrainingArguments(logging_dir=...), 5.x from the environment."""
    from transformers import TrainingArguments

    return "tensorboard" in args.report_to and "logging_dir" in TrainingArguments.__dataclass_fields__


EVAL_SHARE = 0.15  # the most of a run's time that evaluations may take by default
MAX_EVALUATIONS = 5
TRAIN_COST = 2  # forward passes a trained token costs (forward, and a backward without the frozen weights' grads)


def evaluation_cadence(args, world: int, train_set, eval_set, token_columns=("input_ids",)) -> Cadence:
    """Without --eval-steps: evaluate (and save) as often as keeps evaluation under EVAL_SHARE of the run, at most
    MAX_EVALUATIONS times, at least once (at the last step), from the tokens one process trains and evaluates."""
    if args.eval_steps:
        return Cadence(args.eval_steps, f"evaluating every {args.eval_steps} steps (--eval-steps)")
    steps = planned_steps(args, len(train_set), world)
    per_step = mean_tokens(train_set, token_columns) * args.batch_size * args.grad_accum
    evaluated = sum(eval_set.with_format("arrow")["length"].to_pylist()) / world
    affordable = EVAL_SHARE / (1 - EVAL_SHARE) * TRAIN_COST * per_step * steps / max(evaluated, 1)
    every = math.ceil(steps / max(1, min(MAX_EVALUATIONS, int(affordable))))
    count = steps // every
    share = count * evaluated / (count * evaluated + TRAIN_COST * per_step * steps)
    return Cadence(
        every,
        f"evaluating {count} time(s), every {every} steps (about {share:.0%} of the run; --eval-steps to choose)",
    )


def mean_tokens(dataset, columns, sample=256) -> float:
    """Mean tokens per training example, over the first `sample` as the Trainer will draw them (with --negatives, a
    reranker's groups are cut to the sampled negatives): the task's token-id columns, lists of lists included."""
    rows = dataset[: min(sample, len(dataset))]

    def count(value):
        return sum(count(v) for v in value) if value and isinstance(value[0], list) else len(value)

    total = sum(count(ids) for name in columns for ids in rows[name])
    return total / max(1, len(rows[columns[0]]))


def best_evaluation(trainer) -> dict:
    """The eval metrics of the checkpoint that load_best_model_at_end restored, from the run's log: the same
    weights on the same data, not evaluated a second time."""
    state = trainer.state
    if state.best_model_checkpoint:
        step = int(Path(state.best_model_checkpoint).name.rsplit("-", 1)[-1])
        for entry in reversed(state.log_history):
            if entry.get("step") == step and any(key.startswith("eval_") for key in entry):
                return {key: value for key, value in entry.items() if key.startswith("eval_") or key == "epoch"}
    return trainer.evaluate()


def make_trainer(training, model, tokenizer, data, train_set, eval_set, args):
    """The task's Trainer (StableTrainer, PairwiseTrainer, RankingTrainer) with its collator (packing; padding for
    recurrent models or --no-packing), its metrics, StopOnNonFinite and early stopping."""
    from transformers import EarlyStoppingCallback

    from ..guards import StopOnNonFinite
    from ..modeling_rules import recurrent_layer_kinds

    task = data.task
    packing = not (recurrent_layer_kinds(model.config) or args.no_packing)
    callbacks = [StopOnNonFinite()]
    if args.early_stopping:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=args.early_stopping))
    # batches in Trainer's random order: grouping them by length (LengthGroupedSampler) saved no time on packed
    # rows and cost quality in short runs (docs/performance.md, "Batch order")
    return task.trainer_class()(
        model=model,
        args=training,
        train_dataset=task.training_set(data.options, train_set),
        eval_dataset=eval_set,
        data_collator=task.collator(tokenizer, packing, model),
        compute_metrics=task.compute_metrics(data),
        callbacks=callbacks,
        **task.trainer_options(data.options, data, eval_set),
    )


def merged_model(model, args, load: dict, tokenizer, checkpoints: Path, kind):
    """The trained model as one plain checkpoint: LoRA merged into the base; with --qlora merged into the
    full-precision base, not into 4-bit weights."""
    if args.qlora:
        from peft import PeftModel

        model.save_pretrained(checkpoints / "adapter")
        base = kind.load(args.model, **load)
        if len(tokenizer) > base.get_input_embeddings().num_embeddings:  # setup_pad_token added a pad row
            base.resize_token_embeddings(len(tokenizer))  # (peft saved the resized embeddings with the adapter)
        base.config.pad_token_id = tokenizer.pad_token_id
        model = PeftModel.from_pretrained(base, checkpoints / "adapter")
    return model if args.full else model.merge_and_unload()


def zero3_gathered(model, training):
    """Under ZeRO-3 every rank holds a slice of each parameter: gather them (all ranks take part) so rank 0 can merge
    and save a whole model. Elsewhere: nothing to do."""
    if not (training.deepspeed and training.hf_deepspeed_config.is_zero3()):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
