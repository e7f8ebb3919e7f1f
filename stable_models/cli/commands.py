"""`stable-models train | evaluate | predict`: each command is one sequence of named steps that asks the task
(tasks.py: classification, preference, ranking) and its model kind what differs, and never branches on the task's
name. folders.py checks --model and --output, data.py reads and checks files, fine_tuning.py builds the model, adapters
and Trainer, preflight.py checks the model before step 1, engines.py and sharded_scores.py score rows, outputs.py
writes results.
"""

import json
import shutil
import sys
from pathlib import Path

import torch

from ..adapters import save_adapter
from ..modeling_files import ADAPTER, MERGED, folder_form
from .data import CutCount, read_table
from .distributed import Job, output_lock
from .engines import ENGINES, load_model, torch_engine
from .errors import CliError
from .fine_tuning import (
    best_evaluation,
    evaluation_cadence,
    fast_dtype,
    load_base_model,
    make_trainer,
    merged_model,
    training_arguments,
    with_adapters,
    zero3_gathered,
)
from .folders import (
    check_model_path,
    check_output_dir,
    check_prediction_file,
    config_and_tokenizer,
    load_tokenizer,
    task_of_folder,
)
from .outputs import PredictionWriter, write_evaluation
from .preflight import find_unused_parameters, preflight
from .sharded_scores import gathered_scores, scored_batches
from .task_steps import TrainingData, length_limit
from .tasks import for_training, refuse_unread, task_named


def read_training_data(args, say=print) -> TrainingData:
    """--train (and --eval) read and checked by the task that --task names or the columns show; a flag that task does
    not read is refused once the task is known (with --task auto: from the columns, before the task reads a row)."""
    table = read_table(args.train, args.encoding)
    task = for_training(table, args.task)
    refuse_unread(args, task, "train")
    return task.read(task.options(args), table, say)


def loading_options(args, data: TrainingData) -> dict:
    """`from_pretrained` arguments: the task's head and loss options, pooling, fp32 master weights, --gguf-file,
    --attn-implementation."""
    load = dict(
        **data.task.model_options(data.options, data),
        pooling=args.pooling,
        dtype=torch.float32,
        ignore_mismatched_sizes=True,
    )
    if args.gguf_file:
        load["gguf_file"] = args.gguf_file
    if args.attn_implementation:
        load["attn_implementation"] = args.attn_implementation
    return load


def write_training_outputs(model, tokenizer, output: Path, history: list, final: dict) -> dict:
    """The model, its tokenizer (where given), the training log and the final eval metrics (returned without the eval_
    prefix)."""
    if model is not None:
        model.save_pretrained(output)
        tokenizer.save_pretrained(output)
    (output / "training_log.json").write_text(json.dumps(history, indent=1))
    summary = {k.removeprefix("eval_"): v for k, v in final.items() if isinstance(v, (int, float))}
    (output / "eval_metrics.json").write_text(json.dumps(summary, indent=1))
    return summary


def save_trained(args, data: TrainingData, model, load, tokenizer, output: Path, logs, say) -> dict:
    """The output folder: the merged model (with --save-adapter, the adapter on its base, unmerged), the training log
    and metrics, what the task saves beside them, and the model card (cards.py); returns the final metrics."""
    from ..cards import data_record, write_card

    history, final = logs
    if args.save_adapter:
        save_adapter(model, tokenizer, output, args.gguf_file)
        summary = write_training_outputs(None, None, output, history, final)
        config, cells = model.get_base_model().config, data.task.model_kind.consumers(output)
    else:
        model = merged_model(model, args, load, tokenizer, output / "checkpoints", data.task.model_kind)
        summary = write_training_outputs(model, tokenizer, output, history, final)
        data.task.save_more(data.options, data, model, tokenizer, output, say)
        config, cells = model.config, None
    metrics = {k: v for k, v in summary.items() if k in data.task.summary_keys}
    record = data_record(args.train, len(data.train))
    record["evaluated_on"] = Path(args.eval).name if args.eval else f"{record['file']}, held out"
    write_card(output, config, str(args.model), record, metrics, cells)
    return summary


def train(args) -> int:
    """Read and check the data, load the model, run the pre-flight, train, save: the task says what differs."""
    import transformers

    job, output = Job(), Path(args.output)
    if args.task not in (None, "auto"):  # a flag the named task does not read: refused before any file is opened
        refuse_unread(args, task_named(args.task), "train")
    refuse_training_options(args, job, output)
    data = job.main_first(lambda: read_training_data(args, job.say))  # the first reader fills datasets' Arrow cache
    transformers.set_seed(args.seed)
    dtype = fast_dtype() if args.dtype == "auto" else args.dtype
    load = loading_options(args, data)
    tokenizer = load_tokenizer(args.model, args.gguf_file)
    checkpoints = output / "checkpoints"
    with output_lock(output, job):
        train_set, eval_set = tokenized_tables(args, job, data, tokenizer, dtype)
        cadence = evaluation_cadence(
            args, job.world, data.task.training_set(data.options, train_set), eval_set, data.task.token_columns
        )
        job.say(f"[train] {cadence.line}", file=sys.stderr)
        training = training_arguments(args, data, dtype, checkpoints, cadence)  # before the model: ZeRO-3 partitions
        model = trainable_model(args, job, data, load, dtype, tokenizer)
        run_preflight(args, job, model, tokenizer, data, train_set, training)
        trainer = make_trainer(training, model, tokenizer, data, train_set, eval_set, args)
        logs = fit(args, job, trainer, training, checkpoints)
        with zero3_gathered(trainer.model, training):
            summary = job.on_main(
                lambda: save_trained(args, data, trainer.model, load, tokenizer, output, logs, job.say)
            )
        if not args.keep_checkpoints:  # a finished run's folder is the model; a killed run keeps them for --resume
            job.on_main(lambda: shutil.rmtree(checkpoints, ignore_errors=True))
    job.on_main(lambda: say_trained(job, data.task, summary, output))
    job.leave()
    return 0


def refuse_training_options(args, job, output: Path) -> None:
    """The checks of train's own options that need no data: the output folder, the model path, exclusive flags."""
    job.on_main(lambda: check_output_dir(output, args.overwrite, args.resume))
    if args.full and args.qlora:
        raise CliError("--full and --qlora exclude each other")
    if args.save_adapter and (args.full or getattr(args, "save_generative", False)):
        raise CliError("--save-adapter keeps the LoRA unmerged: --full trains no adapter, --save-generative merges it")
    check_model_path(args.model, args.gguf_file)


def tokenized_tables(args, job, data: TrainingData, tokenizer, dtype: str):
    """The tokenized (train, eval) tables, made before the model is loaded (its pad token chosen as it will be with
    the model), so that the run's TrainingArguments are built once, from them, before ZeRO-3 needs them."""
    from transformers import AutoConfig

    from ..tokenization import setup_pad_token

    task = data.task
    setup_pad_token(tokenizer, model_follows=True)
    task.prepare(data.options, data, tokenizer, job.say)
    where = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    limit = length_limit(args, AutoConfig.from_pretrained(args.model, **where))
    train_set, eval_set = job.main_first(lambda: task.tokenize(data.options, tokenizer, limit, data, job.say))
    job.say(
        f"[train] {len(train_set)} train / {len(eval_set)} eval {task.noun}, max length "
        f"{task.longest(train_set, tokenizer)}, {dtype}" + (f", {job.world} processes" if job.world > 1 else ""),
        file=sys.stderr,
    )
    return train_set, eval_set


def trainable_model(args, job, data: TrainingData, load: dict, dtype: str, tokenizer):
    """The model as it will train: the task's kind, the tokenizer's pad token (a row grown for one it added), the
    task's changes, LoRA attached."""
    from ..tokenization import setup_pad_token

    task = data.task
    job.say(
        f"[train] loading {args.model} as a {task.describe_model(data)} model with {len(data.names)} output(s)",
        file=sys.stderr,
    )
    model = load_base_model(args, load, dtype, task.model_kind)
    setup_pad_token(tokenizer, model)
    task.prepare_model(data.options, data, model, tokenizer, job.say)
    return with_adapters(model, args, task.model_kind)


def run_preflight(args, job, model, tokenizer, data: TrainingData, train_set, training) -> None:
    """The pre-flight on rank 0 (it leaves the weights as they were; Trainer seeds every rank alike afterwards), and
    DDP's search for unused parameters where the model needs it."""
    task = data.task
    if training.deepspeed and training.hf_deepspeed_config.is_zero3():
        job.say("[train] pre-flight skipped: ZeRO-3 holds each parameter in slices", file=sys.stderr)
        return
    examples = task.preflight_examples(data, train_set)
    unused = job.on_main(lambda: preflight(task.model_kind, model, tokenizer, examples, args.model))
    training.ddp_find_unused_parameters = find_unused_parameters(model, unused, job)


def fit(args, job, trainer, training, checkpoints: Path) -> tuple[list, dict]:
    """Train (from the last checkpoint with --resume); returns (the log, the best checkpoint's eval metrics, which
    load_best_model_at_end restored)."""
    resume = args.resume and any(checkpoints.glob("checkpoint-*"))
    if args.resume and not resume:
        job.say(f"[train] --resume: no checkpoint in {checkpoints}, starting from step 0", file=sys.stderr)
    trainer.train(resume_from_checkpoint=True if resume else None)
    final = best_evaluation(trainer)
    if training.report_to:  # the final metrics reach the tracker too, as eval/best_*
        trainer.log({f"eval_best_{k.removeprefix('eval_')}": v for k, v in final.items() if k.startswith("eval_")})
    return list(trainer.state.log_history), final


LOADERS = ("stable_models", "transformers, trust_remote_code")  # the consumer matrix's columns that load a folder


def say_trained(job, task, summary: dict, output: Path) -> None:
    """The closing lines: the metrics, then how to load and serve the folder, from its row of the consumer matrix
    (the lines `verify` prints)."""
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k in task.summary_keys)
    job.say(f"[train] done: {metrics}")
    cells = {cell.consumer: cell for cell in task.model_kind.consumers(output)}
    # each loader's call, without the cell's notes on rendering inputs (verify prints those)
    load = [cells[name].how.split(";")[0] for name in LOADERS if cells[name].ok]
    job.say(f"[train] model: {output} ({' or '.join(load)})")
    # a temperature folds into merged weights, for the tasks whose evaluate fits one
    calibrate = " --calibrate" if task.calibrates and folder_form(output) == MERGED else ""
    job.say(f"[train] next: stable-models evaluate --model {output} --data <test file>{calibrate}")
    server, offline = cells["vLLM server"], cells["vLLM offline"]
    if server.ok:
        job.say(
            f"[train] serve: python -m vllm.entrypoints.openai.api_server --model {output} --runner pooling; "
            f"{server.how}"
        )
    elif offline.ok:
        job.say(f"[train] serve (vLLM offline): {offline.how}")


def evaluate(args) -> int:
    """The task's report on labelled data: every rank scores its shard, rank 0 gathers, reports and (--calibrate)
    saves the calibrated model in place."""
    job = Job()
    config, tokenizer = config_and_tokenizer(args.model)
    if args.calibrate and folder_form(args.model) == ADAPTER:
        raise CliError(f"--calibrate folds a temperature into a model; {args.model} is an adapter: merge it first")
    task = task_of_folder(config, args.model)
    refuse_unread(args, task, "evaluate")
    options = task.options(args)
    task.check_evaluate(options, config)
    table = job.main_first(lambda: read_table(args.data, args.encoding))
    scoring = job.on_main(lambda: task.evaluation_input(options, table, config, tokenizer, job.say))
    table = job.main_first(lambda: task.scored_table(options, table, scoring))
    model = load_model(task.model_kind, args.model, job.device, config)
    cuts = CutCount()
    render = task.render(scoring, tokenizer, options, cuts)
    engine = torch_engine(task.model_kind, model, tokenizer, args.batch_size)  # --calibrate folds into this model
    scores = gathered_scores(job, scored_batches(job, table, task.scored_columns(scoring, options), render, engine))
    cuts.warn(job, "evaluate", args.data)
    job.on_main(lambda: write_evaluation(args, model, task.evaluation(options, model, table, scoring, scores)))
    job.leave()
    return 0


def predict(args) -> int:
    """The task's rows for every input row, in input order: each rank scores its contiguous shard as it streams and
    writes a part file; rank 0 joins them and moves the result onto --output only when it is complete (an
    --overwrite never leaves half a file)."""
    if args.engine == "ray":  # a cluster's actors write a folder of shards: ray_predict.py
        from .ray_predict import predict_on_ray

        return predict_on_ray(args)
    job = Job()
    output = Path(args.output)
    job.on_main(lambda: check_prediction_file(output, args.overwrite))
    refuse_engine, load_engine = ENGINES[args.engine]
    refuse_engine(args, job)
    config, tokenizer = config_and_tokenizer(args.model)
    task = task_of_folder(config, args.model)
    refuse_unread(args, task, "predict")
    options = task.options(args)
    table = job.main_first(lambda: read_table(args.data, args.encoding))
    scoring = job.on_main(lambda: task.prediction_input(options, table, config, tokenizer, job.say))
    table = job.main_first(lambda: task.scored_table(options, table, scoring))
    if job.is_main:
        output.parent.mkdir(parents=True, exist_ok=True)
    engine = load_engine(args, job, tokenizer, task.model_kind, config)
    job.barrier()
    columns = task.prediction_columns(scoring, config, options)
    writer = PredictionWriter(output, job, columns, task.ranked_by(scoring, options), args.top_k, task.csv_prefixes)
    cuts = CutCount()
    render = task.render(scoring, tokenizer, options, cuts)
    try:
        for batch, scores in scored_batches(job, table, task.scored_columns(scoring, options), render, engine):
            writer.write(task.prediction_rows(batch, scores, scoring, config, options))
    except BaseException:
        writer.discard()
        raise
    cuts.warn(job, "predict", args.data)
    writer.finish()
    job.say(f"predict: {len(table)} rows -> {output}")
    job.leave()
    return 0
