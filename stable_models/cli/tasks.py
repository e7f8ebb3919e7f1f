"""The tasks of `stable-models train / evaluate / predict`: which there are, which one a run has, and the options
each reads.

A task is one module of this package (`classification`, `preference`, `ranking`) defining `TASK`, an instance of a
`task_steps.Task` subclass, imported here by name. The commands choose the task once (`for_training` from the file's
columns or `--task`; `for_model` from a saved model's config) and then ask it the same questions in the same order;
they never branch on a task's name. docs/development.md ("Adding a task") walks through a new one.
"""

import importlib

from .errors import CliError
from .task_steps import Task

# the tasks, in the order `--task auto` asks them whether a training file is theirs (the first that claims it wins;
# classification, which claims every file, comes last)
TASKS = ("preference", "ranking", "embedding", "classification")


def task_named(name: str) -> Task:
    return importlib.import_module(f".{name}", __package__).TASK


def for_training(table, requested: str) -> Task:
    """`--task NAME`, or for `auto` the first task that claims the table's columns."""
    if requested not in (None, "auto"):
        return task_named(requested)
    return next(task for task in map(task_named, TASKS) if task.claims(table))


def for_model(config) -> Task:
    """The task a saved model was trained for, from its config (its label map and problem type)."""
    return next(task for task in map(task_named, TASKS) if task.owns_model(config))


# the options every task reads (or the command itself), per command: with the tasks' `reads`, every option of the
# parsers (tests/test_task_options.py checks that none is in neither)
COMMON_OPTIONS = {
    "train": {
        "config", "model", "gguf_file", "train", "encoding", "verbose", "eval", "eval_fraction", "output", "overwrite",
        "resume", "keep_checkpoints", "epochs", "max_steps", "full", "qlora", "save_adapter", "lora_r", "lora_target",
        "lora_dropout", "attn_implementation", "deepspeed", "fsdp", "gradient_checkpointing", "weight_decay",
        "warmup_ratio", "scheduler", "lr", "batch_size", "grad_accum", "max_length", "dtype", "pooling", "no_packing",
        "eval_steps", "early_stopping", "seed", "report_to", "run_name", "task",
    },
    "evaluate": {"config", "model", "data", "encoding", "verbose", "calibrate", "report_dir", "batch_size"},
    "predict": {
        "config", "model", "data", "encoding", "verbose", "output", "overwrite", "batch_size", "engine",
        "tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "vllm_dtype", "ray_address", "actors",
        "cpus_per_actor", "gpus_per_actor", "block_rows",
    },
}  # fmt: skip


def task_options(command: str) -> set:
    """The options of `command` that some task reads and another does not: the union of the tasks' `reads`."""
    return {dest for task in map(task_named, TASKS) for dest in task.reads.get(command, ())}


def refuse_unread(args, task: Task, command: str) -> None:
    """One line for the first option the user gave that this run's task does not read (`Task.reads`), naming the
    tasks that do: the one place where every command refuses a flag that would be ignored."""
    for dest in sorted(getattr(args, "given", ())):
        if dest in task_options(command) and dest not in task.reads.get(command, ()):
            readers = [t.kind for t in map(task_named, TASKS) if dest in t.reads.get(command, ())]
            flag = "--" + dest.replace("_", "-")
            raise CliError(f"{flag} is read for {' and '.join(readers)} in {command}, not for {task.kind}: drop it")
