"""The tasks of `stable-models train / evaluate / predict`, and the steps each one implements.

A task is one module of this package (`classification`, `preference`, `ranking`) defining `TASK`, an instance of a
`Task` subclass. The commands choose the task once (`for_training` from the file's columns or `--task`; `for_model`
from a saved model's config) and then ask it the same questions in the same order; they never branch on a task's
name.
docs/development.md ("Adding a task") walks through a new one.
"""

import importlib
import sys
from dataclasses import dataclass, field

from .errors import CliError

# the tasks, in the order `--task auto` asks them whether a training file is theirs (the first that claims it wins;
# classification, which claims every file, comes last)
TASKS = ("preference", "ranking", "classification")
LENGTH_UNLIMITED = 10**9


def task_named(name: str) -> "Task":
    return importlib.import_module(f".{name}", __package__).TASK


def for_training(table, requested: str) -> "Task":
    """`--task NAME`, or for `auto` the first task that claims the table's columns."""
    if requested not in (None, "auto"):
        return task_named(requested)
    return next(task for task in map(task_named, TASKS) if task.claims(table))


def for_model(config) -> "Task":
    """The task a saved model was trained for, from its config (its label map and problem type)."""
    return next(task for task in map(task_named, TASKS) if task.owns_model(config))


def length_limit(args, model) -> int:
    """Tokens a training example may hold: --max-length, and never more than the model has positions for."""
    positions = getattr(model.config.get_text_config(), "max_position_embeddings", LENGTH_UNLIMITED)
    return min(args.max_length or LENGTH_UNLIMITED, positions or LENGTH_UNLIMITED)


def warn(say, text: str) -> None:
    say(text, file=sys.stderr)


@dataclass
class TrainingData:
    """The checked training and eval tables of `train` (datasets, memory-mapped), with the model's outputs."""

    task: "Task"
    train: object
    eval: object
    problem_type: str  # transformers' config.problem_type of the model this trains
    names: list  # the model's outputs: config.id2label in order
    details: tuple = field(default=())  # what the task needs to tokenize its tables (preference: their layouts)

    @property
    def label2id(self) -> dict:
        return {name: i for i, name in enumerate(self.names)}


# what a problem type of classification refuses among the options the classification task reads
PROBLEM_OPTIONS = {
    "class_weights": "--class-weights applies to single-label classification",
    "label_smoothing": "--label-smoothing applies to single-label classification",
    "pos_weight": "--pos-weight applies to multi-label classification",
}


def refuse_options(args, names) -> None:
    """A one-line error for the first of `names` (PROBLEM_OPTIONS) that the command line set."""
    for name in names:
        if getattr(args, name, None):
            raise CliError(PROBLEM_OPTIONS[name])


# the options every task reads (or the command itself), per command: with the tasks' `reads`, every option of the
# parsers (tests/test_cli.py checks that none is in neither)
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
        "tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "vllm_dtype",
    },
}  # fmt: skip


def task_options(command: str) -> set:
    """The options of `command` that some task reads and another does not: the union of the tasks' `reads`."""
    return {dest for task in map(task_named, TASKS) for dest in task.reads.get(command, ())}


def refuse_unread(args, task: "Task", command: str) -> None:
    """One line for the first option the user gave that this run's task does not read (`Task.reads`), naming the
    tasks that do: the one place where every command refuses a flag that would be ignored."""
    for dest in sorted(getattr(args, "given", ())):
        if dest in task_options(command) and dest not in task.reads.get(command, ()):
            readers = [t.kind for t in map(task_named, TASKS) if dest in t.reads.get(command, ())]
            flag = "--" + dest.replace("_", "-")
            raise CliError(f"{flag} is read for {' and '.join(readers)} in {command}, not for {task.kind}: drop it")


class ModelInputs:
    """A collator that passes on only the columns the inner collator takes (the tables hold more: `length`, for the
    evaluation cadence and the length limit)."""

    def __init__(self, collator, keys):
        self.collator, self.keys = collator, keys

    def __call__(self, features):
        return self.collator([{k: f[k] for k in self.keys if k in f} for f in features])


class Task:
    """The steps every task implements, in the order the commands ask them.

    train: `claims` (auto-detection) -> `read` (read and check --train / --eval) -> `model_options` (the head and its
    loss) -> `prepare` (checks that need the tokenizer; what train prints about rendering) -> `prepare_model` ->
    `tokenize` -> `training_set`, `collator`, `trainer_class`, `trainer_options`, `compute_metrics`, `best_metric`
    (the Trainer) -> `preflight_examples`.
    evaluate / predict: `owns_model` -> `check_options` -> `scoring_input` (read and check the file) ->
    `scored_table` -> `render` (a batch of rows as token ids, one list per scored side) -> `evaluation` (the report) or
    `prediction_columns` and `prediction_rows` (what predict writes).
    """

    name = ""
    kind = ""  # what its models are, in messages ("classifiers")
    noun = "examples"  # what one training row is, in messages
    # {command: the options this task reads among those only some tasks read}; any other of those is refused
    # (refuse_unread). Options every task reads (--model, --batch-size, ...) are in no task's list.
    reads: dict = {}
    summary_keys = ("loss",)  # the final eval metrics train prints

    # --- choosing the task
    def claims(self, table) -> bool:
        raise NotImplementedError

    def owns_model(self, config) -> bool:
        raise NotImplementedError

    # --- train
    def read(self, args, table, say) -> TrainingData:
        raise NotImplementedError

    def model_options(self, args, data: TrainingData) -> dict:
        """from_pretrained arguments for the head: num_labels, id2label, label2id, problem_type and loss options."""
        return dict(
            num_labels=len(data.names),
            id2label=dict(enumerate(data.names)),
            label2id=data.label2id,
            problem_type=data.problem_type,
        )

    def describe_model(self, data: TrainingData) -> str:
        return data.problem_type.replace("_", " ")

    def prepare(self, args, data: TrainingData, tokenizer, say) -> None:
        """Checks that need the tokenizer (a chat template), and what train says about how rows become tokens."""

    def prepare_model(self, args, model, tokenizer, say) -> None:
        """Changes to the freshly loaded model before adapters are attached (a reranker's head from LM tokens)."""

    def tokenize(self, args, tokenizer, limit: int, data: TrainingData, say) -> tuple:
        raise NotImplementedError

    def save_more(self, args, model, tokenizer, output, say) -> None:
        """After the model is saved (rank 0): other forms of it the options ask for (a reranker's generative form)."""

    def training_set(self, args, train_set):
        """The training table as the Trainer draws from it (a reranker samples negatives anew each epoch)."""
        return train_set

    def longest(self, train_set, tokenizer) -> int:
        return tokenizer.model_max_length

    def collator(self, tokenizer, packing: bool, model):
        raise NotImplementedError

    def trainer_class(self):
        from ..trainers import StableTrainer

        return StableTrainer

    def trainer_options(self, args, data: TrainingData, eval_set) -> dict:
        return {}

    def compute_metrics(self, data: TrainingData):
        """Trainer's compute_metrics: eval predictions -> {metric: float}."""
        raise NotImplementedError

    def best_metric(self, data: TrainingData) -> tuple[str, bool]:
        """(the eval metric that picks the best checkpoint and drives early stopping, whether greater is better)."""
        raise NotImplementedError

    def preflight_examples(self, data: TrainingData, train_set) -> tuple:
        """(token-id lists, their labels, the label dtype) for the pre-flight check of the model's numerics."""
        raise NotImplementedError

    # --- evaluate and predict
    def check_options(self, args, config, command: str) -> None:
        """Refuse options this task does not take (before the file is read)."""

    def scoring_input(self, args, table, config, tokenizer, command: str, say):
        """Check the evaluate / predict file; returns what `render` and the report need (sent to every rank)."""
        raise NotImplementedError

    def scored_table(self, args, table, spec):
        """The table whose rows are scored (a reranker scores one row per document of each group)."""
        return table

    def scored_columns(self, spec, args) -> list[str]:
        raise NotImplementedError

    def render(self, spec, tokenizer, args, cuts):
        """A function from a batch of rows (a dict of columns) to a list of sides, each a list of token-id lists; the
        rows it truncates go to `cuts` (`data.CutCount`), for the command's warning."""
        raise NotImplementedError

    def evaluation(self, args, model, table, spec, scores) -> dict:
        """The report of an evaluation (rank 0): `report`, `draw(folder, training_log)`, `text(report)` and the
        name of what --calibrate fits."""
        raise NotImplementedError

    def prediction_columns(self, spec, config, args) -> list[str]:
        raise NotImplementedError

    def prediction_rows(self, batch, scores, spec, config, args) -> list[dict]:
        raise NotImplementedError

    def ranked_by(self, spec, args):
        """(group column, score field) when predict ranks rows within groups, else None."""
        return None
