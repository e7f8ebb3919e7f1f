"""`stable-models predict --engine ray`: predict's rows for every task on a Ray cluster, each row written exactly once.

The input (Parquet or JSON-lines shards: a folder or a glob) is cut into blocks of rows, named by shard and first
row. One Ray Data `map_batches` stage of actors (`BlockWriter`, the model loaded once per actor) reads a block,
tokenizes its next chunk in a thread while the model scores the current one (batches sorted by length), and writes
the block's rows to `OUTPUT/<shard>-<first row>.parquet` under a temporary name, renamed when complete. So:

- a retried block (its actor killed) overwrites its file and never adds rows;
- a re-run after the driver died skips the blocks already committed (`_run.json` says which run they belong to);
- memory stays flat: an actor holds one chunk of one block; the driver holds a summary per block.

Each row holds predict's fields, `shard` (the input file's name), `row` (its row in that file, 0 = first) and the
input's `id` where it has that column. A reranker's group layout gets its documents' ranks (a row holds the whole
group); ranks over several input rows (a reranker's pointwise rows, a reward model's --group-key) are left out, as
a group may lie in several blocks, and `--top-k` is refused.
`Predictor` is the same scoring as a class UDF for users' own Ray pipelines.
"""

import contextlib
import json
import os
import re
import sys
import threading
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import CliError

RAY_SPEC = "ray[data]==2.60.0"  # the release the cluster tier tests (tests/cluster)
SUFFIXES = (".parquet", ".jsonl")
MIN_BLOCK_ROWS, MAX_BLOCK_ROWS, BLOCKS_PER_ACTOR = 100, 100_000, 4  # the default --block-rows
CHUNK_ROWS = 1_024  # rows an actor tokenizes while it scores the previous chunk
RUN_FILE = "_run.json"  # what the run is (model, data, options): a re-run with the same resumes
SUMMARY_FILE = "_SUCCESS.json"  # written last: the run is complete
# the files a run writes: its blocks, a killed worker's temporary file, _run.json and _SUCCESS.json
OUR_FILES = re.compile(rf"(.+-\d{{12}}\.parquet|\..+\.tmp|{re.escape(RUN_FILE)}|{re.escape(SUMMARY_FILE)})")
RETRIES = 3  # restarts of a killed actor, and retries of its block (an actor that cannot start fails the run)


@dataclass(frozen=True)
class Block:
    """Rows [start, stop) of one input shard, written to OUTPUT/`name`."""

    shard: str
    start: int
    stop: int
    name: str


def input_shards(data: str) -> list[Path]:
    """The Parquet / JSON-lines files of --data: a folder's (sorted), a glob's matches, or one file."""
    import glob

    path = Path(data)
    found = sorted(path.iterdir()) if path.is_dir() else [Path(p) for p in sorted(glob.glob(data))]
    shards = [p.resolve() for p in found if p.is_file() and p.suffix in SUFFIXES]  # actors have their own cwd
    if not shards:
        raise CliError(f"--data {data}: no .parquet or .jsonl files (--engine ray reads a folder, a glob or a file)")
    names = [p.stem for p in shards]
    if len(set(names)) != len(names):
        raise CliError(f"--data {data}: two shards share a name ({', '.join(names)}); output files are named by it")
    return shards


def shard_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with open(path, encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def blocks_of(rows: dict, size: int) -> list[Block]:
    """The blocks of `size` rows of each shard (`rows`: its rows by shard)."""
    return [
        Block(str(shard), start, min(start + size, count), f"{shard.stem}-{start:012d}.parquet")
        for shard, count in rows.items()
        for start in range(0, count, size)
    ]


def default_block_rows(total: int, actors: int) -> int:
    """BLOCKS_PER_ACTOR blocks for each actor (work shared evenly to the end, long sorted batches within a block),
    within [MIN_BLOCK_ROWS, MAX_BLOCK_ROWS]."""
    return min(MAX_BLOCK_ROWS, max(MIN_BLOCK_ROWS, -(-total // (actors * BLOCKS_PER_ACTOR))))


def read_block(block: Block, chunk_rows: int = CHUNK_ROWS):
    """(first row in the shard, the rows as a pyarrow table) of up to `chunk_rows` rows at a time: the block read as a
    stream (memory flat in the shard's rows)."""
    import pyarrow as pa

    if block.shard.endswith(".parquet"):
        import pyarrow.parquet as pq

        seen = 0
        for batch in pq.ParquetFile(block.shard).iter_batches(batch_size=chunk_rows):
            low, high = max(block.start - seen, 0), min(block.stop - seen, batch.num_rows)
            if low < high:
                yield seen + low, pa.Table.from_batches([batch.slice(low, high - low)])
            seen += batch.num_rows
            if seen >= block.stop:
                return
        return
    rows, index = [], 0
    with open(block.shard, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            if block.start <= index < block.stop:
                rows.append(json.loads(line))
                if len(rows) == chunk_rows:
                    yield index + 1 - len(rows), pa.Table.from_pylist(rows)
                    rows = []
            index += 1
            if index >= block.stop:
                break
    if rows:
        yield index - len(rows), pa.Table.from_pylist(rows)


class Predictor:
    """predict's rows for a batch of input rows, with the model loaded once: a class UDF for Ray Data's
    `map_batches` (batch_format="pyarrow"), or for any loop over batches.

        ds.map_batches(Predictor, fn_constructor_kwargs={"model": folder}, batch_format="pyarrow",
                       compute=ray.data.ActorPoolStrategy(size=2))

    `options`: predict's options by name (`text_key="text"`, `prompt_name="query"`, `group_key=...`; `top_k` needs
    whole groups and is refused). `device`: the GPU where the actor has one, else the CPU. Rows longer than the
    model's limit are cut as predict cuts them and counted in `cuts.rows`."""

    def __init__(self, model: str, batch_size: int = 16, device=None, **options):
        from .arguments import parse
        from .data import CutCount
        from .engines import load_model, torch_engine
        from .folders import config_and_tokenizer, task_of_folder
        from .tasks import refuse_unread

        if options.get("top_k"):
            raise CliError("top_k needs whole groups, which a batch may split: rank from the output's scores")
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items() if v is not None]
        args = parse(["predict", f"--model={model}", "--data=rows", "--output=rows.parquet", *flags])
        self.config, self.tokenizer = config_and_tokenizer(args.model)
        self.task = task_of_folder(self.config, args.model)
        refuse_unread(args, self.task, "predict")
        self.options = self.task.options(args)
        import torch

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")  # the actor's GPU, where it has one
        model = load_model(self.task.model_kind, args.model, device, self.config)
        self.engine = torch_engine(self.task.model_kind, model, self.tokenizer, batch_size)
        self.cuts, self.unranked = CutCount(), False  # unranked: ranks over several input rows were left out

    def tokenized(self, table, source: str = "the batch"):
        """(the scored rows, their sides of token ids, the task's scoring input) of a pyarrow table of input rows;
        `source` names them in the one-line error about a bad row."""
        import dataclasses

        import datasets

        rows, options = datasets.Dataset(table), dataclasses.replace(self.options, data=source)
        scoring = self.task.prediction_input(options, rows, self.config, self.tokenizer, lambda *a, **k: None)
        rows = self.task.scored_table(options, rows, scoring)
        batch = rows.select_columns(self.task.scored_columns(scoring, options)).to_dict()
        render = self.task.render(scoring, self.tokenizer, options, self.cuts)
        return batch, render(batch), scoring

    def scored(self, table, batch, sides, scoring) -> tuple[list[dict], list[int]]:
        """predict's rows of one tokenized table (a reranker's group layout: ranked within each group), each with the
        input's `id` where the table has one; and each row's input row in the table."""
        logits = self.engine([ids for side in sides for ids in side]).float()
        scores = logits.reshape(len(sides), len(sides[0]), -1).transpose(0, 1)
        rows = self.task.prediction_rows(batch, scores, scoring, self.config, self.options)
        ranked_by = self.task.ranked_by(scoring, self.options)
        rows = ranked(rows, ranked_by, scoring)
        self.unranked = self.unranked or (ranked_by is not None and getattr(scoring, "pointwise_rows", True))
        inputs = list(batch["group"]) if "group" in batch else list(range(len(rows)))  # a group: one input row
        if "id" in table.column_names:
            ids = table.column("id").to_pylist()
            for row, i in zip(rows, inputs, strict=True):
                row["id"] = ids[i]
        return rows, inputs

    def __call__(self, table):
        import pyarrow as pa

        if table.num_rows == 0:
            return pa.table({})
        return pa.Table.from_pylist(self.scored(table, *self.tokenized(table))[0])


def ranked(rows: list[dict], ranked_by, scoring) -> list[dict]:
    """Ranks within each group where a row of the input held the whole group (a reranker's group layouts); rows
    unchanged elsewhere (pointwise rows: a group may lie in several blocks)."""
    if ranked_by is None or getattr(scoring, "pointwise_rows", True):
        for row in rows:
            row.pop("rank", None)
        return rows
    from .outputs import rank_in

    group, field = ranked_by
    scores: dict = {}
    for row in rows:
        scores.setdefault(row[group], []).append(row[field])
    ordered = {key: sorted(values) for key, values in scores.items()}
    for row in rows:
        row["rank"] = rank_in(ordered[row[group]], row[field])  # predict's rule (PredictionWriter)
    return rows


class BlockWriter:
    """A Ray actor that writes whole blocks: `__call__` gets a batch of Block records and returns a summary row per
    block (rows written, rows cut). `crash_block` (tests): the actor dies, once, with that block's rows written
    under the temporary name and not yet renamed."""

    def __init__(self, model, output, options, batch_size=16, crash_block=None, crash_marker=None):
        self.predictor = Predictor(model, batch_size, **options)
        self.output, self.crash = Path(output), (crash_block, crash_marker)

    def __call__(self, batch):
        import resource

        summaries = {"name": [], "rows": [], "cut": [], "peak_rss_mb": [], "unranked": []}
        for fields in zip(*(batch[k] for k in ("shard", "start", "stop", "name")), strict=True):
            block = Block(str(fields[0]), int(fields[1]), int(fields[2]), str(fields[3]))
            cut_before = self.predictor.cuts.rows
            summaries["name"].append(block.name)
            summaries["rows"].append(self.write(block))
            summaries["cut"].append(self.predictor.cuts.rows - cut_before)
            summaries["unranked"].append(self.predictor.unranked)
            summaries["peak_rss_mb"].append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # Linux: KiB
        return summaries

    def write(self, block: Block) -> int:
        """The block's rows into a temporary file, renamed onto its name when complete; returns the input rows."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        final = self.output / block.name
        temporary = final.with_name(f".{block.name}.{os.getpid()}.tmp")
        writer, written, shard = None, 0, Path(block.shard).name

        def tokenized(chunk):
            first, table = chunk
            return self.predictor.tokenized(table, f"{shard} (its rows from {first + 1})")

        try:
            for (first, table), prepared in prefetched(read_block(block), tokenized):
                rows, inputs = self.predictor.scored(table, *prepared)
                for row, i in zip(rows, inputs, strict=True):
                    row["shard"], row["row"] = shard, first + i
                    if "group" in row:
                        row["group"] = row["row"] + 1  # the group's number in its shard (1 = first)
                out = pa.Table.from_pylist(rows, schema=writer.schema if writer else None)
                writer = writer or pq.ParquetWriter(temporary, out.schema)
                writer.write_table(out)
                written += table.num_rows
            if writer is not None:
                writer.close()
                writer = None
                self.maybe_crash(block)
                os.replace(temporary, final)
        finally:
            if writer is not None:
                writer.close()
            temporary.unlink(missing_ok=True)
        if written == 0:  # an empty block still commits, so a re-run does not redo it
            pq.write_table(pa.table({"shard": pa.array([], pa.string()), "row": pa.array([], pa.int64())}), final)
        return written

    def maybe_crash(self, block: Block) -> None:
        name, marker = self.crash
        if name == block.name and marker and not Path(marker).exists():
            Path(marker).write_text(str(os.getpid()))
            os._exit(1)  # a worker killed mid-block: its whole temporary file stays behind, never renamed


def prefetched(chunks, tokenize):
    """(chunk, tokenize(chunk)) for each chunk; the next one is read and tokenized in a thread while the caller scores
    this one (reading, tokenizers and torch release the GIL)."""
    chunks = iter(chunks)
    result: dict = {}

    def work():
        try:
            chunk = next(chunks, None)
            result["value"] = None if chunk is None else (chunk, tokenize(chunk))
        except BaseException as error:  # re-raised in the caller
            result["error"] = error

    def start():
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        return thread

    thread = start()
    while True:
        thread.join()
        if "error" in result:
            raise result.pop("error")
        value = result.pop("value")
        if value is None:
            return
        thread = start()
        yield value


def run_record(args, shards: list[Path], options: dict) -> dict:
    """What a run is: a re-run with the same record resumes (with the block size the record keeps)."""
    return {"model": str(Path(args.model).resolve()), "data": [str(p) for p in shards], "options": options}


def recorded_block_rows(output: Path, record: dict) -> int | None:
    """The block size of the same run, written into `output` before (a re-run cuts the blocks it cut)."""
    run_file = output / RUN_FILE
    if not run_file.is_file():
        return None
    previous = json.loads(run_file.read_text())
    return previous.get("block_rows") if {**previous, "block_rows": None} == {**record, "block_rows": None} else None


def prepared_output(output: Path, record: dict, overwrite: bool) -> set[str]:
    """The output folder for this run; the names of the blocks already committed to it (a re-run of the same run
    resumes; another run's folder is refused unless --overwrite, which empties it)."""
    run_file = output / RUN_FILE
    if output.exists() and any(output.iterdir()):
        same = run_file.is_file() and json.loads(run_file.read_text()) == record
        others = [p.name for p in output.iterdir() if not OUR_FILES.fullmatch(p.name)]
        if others:  # --overwrite removes a run's files, never a user's
            raise CliError(f"--output {output} holds files that no run wrote ({others[0]}, ...); name another folder")
        if overwrite:
            for path in output.iterdir():
                path.unlink()
        elif not same:
            raise CliError(f"--output {output} holds another run's files; pass --overwrite or another folder")
        elif (output / SUMMARY_FILE).is_file():
            raise CliError(f"--output {output} is a finished run; pass --overwrite to score again")
    output.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps(record, indent=1))
    return {p.name for p in output.glob("*.parquet")}


def ray_options(args) -> dict:
    """Actors and what each asks for: one per GPU (a fraction with --gpus-per-actor < 1), or one per
    --cpus-per-actor cores on CPU."""
    import ray

    resources = ray.cluster_resources()
    if args.gpus_per_actor is None:
        gpus = 1.0 if resources.get("GPU", 0) >= 1 else 0.0
    else:
        gpus = args.gpus_per_actor
    if args.actors:
        actors = args.actors
    elif gpus:
        actors = max(1, int(resources.get("GPU", 0) / gpus))
    else:
        actors = max(1, int(resources.get("CPU", 1) // (args.cpus_per_actor * 2)))  # half the cores: read and write
    return {"actors": actors, "num_cpus": args.cpus_per_actor, "num_gpus": gpus}


def predict_on_ray(args) -> int:
    """The run: blocks not yet committed are scored and written by the actors; the summary row of each comes back
    to the driver as it finishes, and _SUCCESS.json is written once every block's file is there."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise CliError(f"--engine ray needs Ray: pip install 'stable_models[ray]' ({RAY_SPEC})")
    if args.top_k:
        raise CliError(
            "--top-k needs whole groups, which --engine ray's blocks may split: score with --engine ray, then keep "
            "the best of each group from the output's rank (a row holds a whole group) or score with --engine torch"
        )
    from .folders import config_and_tokenizer, task_of_folder
    from .tasks import refuse_unread

    config, _ = config_and_tokenizer(args.model)
    task = task_of_folder(config, args.model)
    refuse_unread(args, task, "predict")
    options = {name: getattr(args, name) for name in task.reads.get("predict", ()) if name in args.given}
    shards, output = input_shards(args.data), Path(args.output)
    if output.suffix in (".jsonl", ".csv", ".parquet"):
        raise CliError(f"--output {output}: --engine ray writes a folder of Parquet shards; name a folder")
    with ray_connection(args):
        placement = ray_options(args)
        rows = {shard: shard_rows(shard) for shard in shards}
        record = run_record(args, shards, options)
        size = args.block_rows or recorded_block_rows(output, record)
        size = size or default_block_rows(sum(rows.values()), placement["actors"])
        blocks = blocks_of(rows, size)
        done = prepared_output(output, {**record, "block_rows": size}, args.overwrite)
        todo = [b for b in blocks if b.name not in done]
        print(
            f"[predict] {sum(rows.values())} rows in {len(blocks)} block(s) of up to {size}, "
            f"{placement['actors']} actor(s); {len(blocks) - len(todo)} already written",
            file=sys.stderr,
        )
        scored, cut, peak = run_blocks(args, todo, options, output, placement) if todo else (0, 0, 0.0)
    missing = [b.name for b in blocks if not (output / b.name).is_file()]
    if missing:
        raise CliError(f"--engine ray: {len(missing)} block(s) not written ({missing[0]}, ...); run the command again")
    for stale in output.glob(".*.tmp"):  # a killed worker's unfinished file
        stale.unlink(missing_ok=True)
    total = sum(rows.values())
    summary = {"rows": total, "blocks": len(blocks), "scored_now": scored, "cut_now": cut, "peak_actor_rss_mb": peak}
    (output / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    if cut:
        print(f"[predict] warning: {cut} row(s) longer than the model's limit were cut to it", file=sys.stderr)
    print(f"predict: {total} rows -> {output}/ ({len(blocks)} Parquet files)")
    return 0


@contextlib.contextmanager
def ray_connection(args):
    """Ray as the caller has it, or connected to --ray-address / RAY_ADDRESS, or a local cluster started for the run
    (and shut down after it)."""
    import ray

    started = not ray.is_initialized()
    if started:
        address = args.ray_address or os.environ.get("RAY_ADDRESS")
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def run_blocks(args, todo: list[Block], options: dict, output: Path, placement: dict) -> tuple[int, int, float]:
    """Score and write `todo` on the cluster; (rows, rows cut, the largest peak resident memory of an actor in MB)."""
    import ray

    crash = os.environ.get("STABLE_MODELS_RAY_CRASH_BLOCK"), os.environ.get("STABLE_MODELS_RAY_CRASH_MARKER")
    exit_after = int(os.environ.get("STABLE_MODELS_RAY_DRIVER_EXIT_AFTER", "0"))
    data = ray.data.from_items([asdict(b) for b in todo], override_num_blocks=len(todo))
    with warnings.catch_warnings():  # Ray 2.60 names no parameter for bounded restarts: ray_remote_args it is
        warnings.simplefilter("ignore", DeprecationWarning)
        written = data.map_batches(
            BlockWriter,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=placement["actors"]),
            num_cpus=placement["num_cpus"],
            num_gpus=placement["num_gpus"],
            fn_constructor_kwargs={
                "model": str(Path(args.model).resolve()),
                "output": str(output.resolve()),
                "options": options,
                "batch_size": args.batch_size,
                "crash_block": crash[0],
                "crash_marker": crash[1],
            },
            max_restarts=RETRIES,  # a killed actor comes back, and its block is retried (its file overwritten);
            max_task_retries=RETRIES,  # a block that kills every actor stops the run instead of looping
        )
    rows = cut = finished = peak = unranked = 0
    try:
        for summary in written.iter_rows():
            rows, cut, finished = rows + summary["rows"], cut + summary["cut"], finished + 1
            peak, unranked = max(peak, summary["peak_rss_mb"]), unranked or summary["unranked"]
            if exit_after and finished >= exit_after:
                os._exit(3)  # tests: the driver killed mid-run
    except Exception as error:  # Ray's wrapping of a block's or an actor's failure: its cause, in one line
        raise CliError(
            f"--engine ray: {finished} block(s) written, then: {first_cause(error)} (the written blocks are kept: "
            "run the command again to go on)"
        ) from None
    if unranked:
        print(
            "[predict] no rank field: a group's rows (pointwise query / document rows, --group-key) may lie in "
            "several blocks; rank them from the output's scores, or use --engine torch",
            file=sys.stderr,
        )
    return rows, cut, peak


def first_cause(error: Exception) -> str:
    """The exception a Ray error wraps, as one line (`CliError`: its message alone), from Ray's traceback text."""
    lines = str(error).splitlines()
    raised = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b: ", line) and not line.startswith("ray.")]
    if not raised:
        return lines[-1] if lines else type(error).__name__
    kind, message = raised[0].split(": ", 1)
    return message if kind.endswith("CliError") else f"{kind.rsplit('.', 1)[-1]}: {message}"
