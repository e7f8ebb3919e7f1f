"""The steps every task implements (`Task`), what `train` reads into (`TrainingData`), and the steps the tasks share
once: the held-out eval split, the length limits, the metrics Trainer logs, predict's copied columns."""

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from ..model_kinds import SEQUENCE_CLASSIFIER
from .data import read_table, split_eval

LENGTH_UNLIMITED = 10**9


def positions(config) -> int:
    """The tokens a model has positions for (LENGTH_UNLIMITED where its config names no limit)."""
    return getattr(config.get_text_config(), "max_position_embeddings", None) or LENGTH_UNLIMITED


def length_limit(args, config) -> int:
    """Tokens a training example may hold: --max-length, and never more than the model (its config) has positions
    for."""
    return min(args.max_length or LENGTH_UNLIMITED, positions(config))


def keep_trained_length(tokenizer, longest: int) -> None:
    """The tokenizer saved with the model keeps the longest input trained (where there was a limit), so evaluate and
    predict cut where training did."""
    if longest < LENGTH_UNLIMITED:
        tokenizer.model_max_length = longest


def held_out(options, train_rows, read_eval):
    """(training rows, eval rows, what `read_eval` found in --eval or None): --eval read by the task's
    `read_eval(table) -> (rows, found)`, or a seeded random --eval-fraction of the training rows held out."""
    if options.eval:
        return train_rows, *read_eval(read_table(options.eval, options.encoding))
    return *split_eval(train_rows, options.eval_fraction, options.seed, options.train), None


def copied_rows(batch: dict, columns) -> list[dict]:
    """predict's rows begin as the input's `columns` (those the batch has), in order."""
    present = [c for c in columns if c in batch]
    return [{c: batch[c][i] for c in present} for i in range(len(next(iter(batch.values()))))]


def read_in(*commands: str, default=None):
    """An option field a task reads in these commands (only some tasks do): `Task.reads` derives from these, and any
    such option given to a task that does not read it is refused (tasks.refuse_unread)."""
    return field(default=default, metadata={"read_in": commands})


@dataclass(frozen=True)
class Options:
    """What a task reads of the command line, parsed once (`from_args`) into a frozen dataclass: the options every
    task reads (here) and, in a task's subclass, its own (each a `read_in(...)` field). A field the command does not
    have stays None."""

    model: str | None = None
    gguf_file: str | None = None
    train: str | None = None
    eval: str | None = None
    eval_fraction: float | None = None
    data: str | None = None
    encoding: str | None = None
    seed: int | None = None
    max_length: int | None = None
    pooling: str | None = None
    no_packing: bool = False
    calibrate: bool = False

    @classmethod
    def from_args(cls, args) -> "Options":
        return cls(**{f.name: getattr(args, f.name, f.default) for f in fields(cls)})

    @classmethod
    def reads(cls) -> dict[str, set]:
        """{command: the options of this class read there among those only some tasks read}."""
        found: dict[str, set] = {}
        for option in fields(cls):
            for command in option.metadata.get("read_in", ()):
                found.setdefault(command, set()).add(option.name)
        return found


@dataclass
class TrainingData:
    """The checked training and eval tables of `train` (datasets, memory-mapped), with the model's outputs."""

    task: "Task"
    train: object
    eval: object
    problem_type: str  # transformers' config.problem_type of the model this trains
    names: list  # the model's outputs: config.id2label in order
    options: Options  # what the task read of the command line
    details: object = None  # what the task needs to tokenize its tables (its own typed record)
    prepared: dict = field(default_factory=dict)  # what prepare_model computed for save_more (a base LM's head)

    @property
    def label2id(self) -> dict:
        return {name: i for i, name in enumerate(self.names)}


@dataclass(frozen=True)
class Evaluation:
    """What a task's `evaluation` returns to evaluate: the report (report.json), `draw(folder, training_log)` (the
    plots, their file names), `text(report)` (the printed form) and the name of what --calibrate fits."""

    report: dict
    draw: Callable
    text: Callable
    fitted: str


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
    `tokenize` (tables holding `token_columns` and a `length` column) -> `training_set`, `collator`, `trainer_class`,
    `trainer_options`, `compute_metrics`, `best_metric` (the Trainer) -> `preflight_examples` -> `save_more`.
    evaluate / predict: `owns_model` -> `check_evaluate` -> `evaluation_input` or `prediction_input` (read and check
    the file into the task's own typed input, sent to every rank) -> `scored_table` -> `scored_columns` and `render`
    (a batch of rows as token ids, one list per scored side) -> `evaluation` (the report) or `prediction_columns` and
    `prediction_rows` (what predict writes).
    """

    name = ""
    kind = ""  # what its models are, in messages ("classifiers")
    noun = "examples"  # what one training row is, in messages
    Options = Options  # the options dataclass this task parses the command line into (its `read_in` fields)
    model_kind = SEQUENCE_CLASSIFIER  # what it trains and scores (stable_models.model_kinds): loading, LoRA, scores
    calibrates = True  # evaluate --calibrate fits a temperature to its scores
    summary_keys = ("loss",)  # the final eval metrics train prints
    # the token-id columns of the tokenized training table (each a list of ids, or of lists of ids); with the `length`
    # column every task's table has (its tokens per example), what the evaluation cadence reads
    token_columns = ("input_ids",)
    csv_prefixes: dict = {}  # predict's dict-valued fields spread over CSV columns named prefix + key

    @property
    def reads(self) -> dict[str, set]:
        """{command: the options this task reads among those only some tasks read}, from its Options' fields; any
        other of those is refused (refuse_unread). Options every task reads (--model, ...) are in no task's list."""
        return self.Options.reads()

    def options(self, args) -> Options:
        """The command line as this task reads it, parsed once: every step after this one gets it, not `args`."""
        return self.Options.from_args(args)

    # --- choosing the task
    def claims(self, table) -> bool:
        raise NotImplementedError

    def owns_model(self, config) -> bool:
        raise NotImplementedError

    # --- train
    def read(self, options, table, say) -> TrainingData:
        raise NotImplementedError

    def model_options(self, options, data: TrainingData) -> dict:
        """from_pretrained arguments for the head: num_labels, id2label, label2id, problem_type and loss options."""
        return dict(
            num_labels=len(data.names),
            id2label=dict(enumerate(data.names)),
            label2id=data.label2id,
            problem_type=data.problem_type,
        )

    def describe_model(self, data: TrainingData) -> str:
        return data.problem_type.replace("_", " ")

    def prepare(self, options, data: TrainingData, tokenizer, say) -> None:
        """Checks that need the tokenizer (a chat template), and what train says about how rows become tokens."""

    def prepare_model(self, options, data: TrainingData, model, tokenizer, say) -> None:
        """Changes to the freshly loaded model before adapters are attached (a reranker's head from LM tokens)."""

    def tokenize(self, options, tokenizer, limit: int, data: TrainingData, say) -> tuple:
        raise NotImplementedError

    def save_more(self, options, data: TrainingData, model, tokenizer, output, say) -> None:
        """After the model is saved (rank 0): other forms of it the options ask for (a reranker's generative form)."""

    def training_set(self, options, train_set):
        """The training table as the Trainer draws from it (a reranker samples negatives anew each epoch)."""
        return train_set

    def longest(self, train_set, tokenizer) -> int:
        return tokenizer.model_max_length

    def collator(self, tokenizer, packing: bool, model):
        raise NotImplementedError

    def trainer_class(self):
        from ..trainers import StableTrainer

        return StableTrainer

    def trainer_options(self, options, data: TrainingData, eval_set) -> dict:
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
    def check_evaluate(self, options, config) -> None:
        """Refuse evaluate's options this model does not take (before the file is read)."""

    def evaluation_input(self, options, table, config, tokenizer, say):
        """evaluate's file, checked: the task's typed input for `render` and the report (sent to every rank)."""
        raise NotImplementedError

    def prediction_input(self, options, table, config, tokenizer, say):
        """predict's file, checked: the task's typed input for `render` and the rows (sent to every rank)."""
        raise NotImplementedError

    def scored_table(self, options, table, scoring):
        """The table whose rows are scored (a reranker scores one row per document of each group)."""
        return table

    def scored_columns(self, scoring, options) -> list[str]:
        raise NotImplementedError

    def render(self, scoring, tokenizer, options, cuts):
        """A function from a batch of rows (a dict of columns) to a list of sides, each a list of token-id lists; the
        rows it truncates go to `cuts` (`data.CutCount`), for the command's warning."""
        raise NotImplementedError

    def evaluation(self, options, model, table, scoring, scores) -> Evaluation:
        """The report of an evaluation (rank 0)."""
        raise NotImplementedError

    def prediction_columns(self, scoring, config, options) -> list[str]:
        raise NotImplementedError

    def prediction_rows(self, batch, scores, scoring, config, options) -> list[dict]:
        raise NotImplementedError

    def ranked_by(self, scoring, options):
        """(group column, score field) when predict ranks rows within groups, else None."""
        return None
