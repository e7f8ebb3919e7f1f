"""`stable-models train | evaluate | predict | verify | doctor`: the command line of stable_models.

The arguments are parsed before anything heavy is imported, so `--help` and argument errors are instant; each command
then imports what it runs. This package imports the library; the library never imports it.
"""

import atexit
import contextlib
import importlib.util
import os
import sys

from .arguments import doctor_parser, parse
from .errors import CliError, report

# what the commands import from the `cli` extra (matplotlib too, but without it they only skip the plots)
CLI_EXTRA = {"pandas": "pandas", "sklearn": "scikit-learn", "scipy": "scipy", "datasets": "datasets"}
CLI_EXTRA_TRAIN = {"accelerate": "accelerate"}  # transformers' Trainer


def check_cli_extra(command: str) -> None:
    """Before any work: a base install (without the `cli` extra) gets one line naming the fix, not a traceback at
    the first evaluation."""
    needed = CLI_EXTRA | (CLI_EXTRA_TRAIN if command == "train" else {})
    missing = [package for module, package in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise CliError(
            f"{command} needs the cli extra ({', '.join(missing)} not installed): pip install 'stable_models[cli]'"
        )


@contextlib.contextmanager
def environment_restored():
    """A command run in-process (`cli.main`) leaves os.environ as it found it: transformers 4.x's TrainingArguments
    writes ACCELERATE_MIXED_PRECISION=bf16 there (where train picks bf16), which turned the caller's later Trainer
    runs, and the processes it starts, into bf16 ones."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


def verify(folder: str) -> int:
    """`stable-models verify FOLDER`: one line per code file, then one per consumer of the folder (who scores it as
    predict does, and how); exit 0 when the code files all match one release, 1 otherwise."""
    from ..verify import verify_folder

    if not os.path.isdir(folder):
        raise CliError(f"{folder}: no such folder")
    verdict = verify_folder(folder)
    for line in verdict.lines():
        print(line)
    from ..loading import adapter_base
    from ..modeling_files import ADAPTER, folder_form

    if folder_form(folder) == ADAPTER:
        print(
            f"a peft adapter on {adapter_base(folder)}: stable_models.from_pretrained builds its base with the "
            "folder's stable_config.json and merges the adapter; the consumers below read that model"
        )
    if any(
        os.path.isfile(os.path.join(folder, name)) for name in ("config.json", "stable_config.json", "reranker.json")
    ):
        print("consumers (who scores this folder as stable-models predict does):")
        for line in consumer_lines(folder):
            print(f"  {line}")
    return 0 if verdict.ok else 1


def consumer_lines(folder: str) -> list[str]:
    from ..consumers import folder_table

    try:
        return [cell.line() for cell in folder_table(folder)]
    except (OSError, ValueError) as error:  # no tokenizer, or a config transformers cannot read
        return [f"cannot tell: {str(error).splitlines()[0]}"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = None
    try:
        if argv[:1] == ["doctor"]:  # its own parser (--model DIR or --log FILE), before torch is imported
            parser = doctor_parser()
            args = parser.parse_args(argv[1:])
            from .doctor import run

            return run(parser, args)
        args = parse(argv)
        if args.command == "verify":
            return verify(args.folder)
        check_cli_extra(args.command)
        from . import commands

        with environment_restored():
            return getattr(commands, args.command)(args)
    except CliError as error:
        report(error, verbose=getattr(args, "verbose", False))  # once per job, not once per process
        return 2


def run() -> None:
    """The `stable-models` command (and `python -m stable_models`): runs the exit functions (trackers, logging,
    temporary files), flushes, then ends with os._exit instead of the interpreter's teardown. That teardown (freeing
    torch, transformers and every module one by one) took 1.4 s of each command here, and under a launcher
    (WORLD_SIZE > 1: torchrun, accelerate, deepspeed) gloo's teardown now and then aborted a rank whose job had
    written everything (SIGABRT, and the launcher reported a crash). Every file the commands write is closed before
    they return."""
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
    except BaseException as error:
        sys.excepthook(*sys.exc_info())
        code = 130 if isinstance(error, KeyboardInterrupt) else 1  # 130: as the shell reports Ctrl-C
    if isinstance(code, str):  # sys.exit("message"), as the interpreter would print it
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
