"""The folders and files the commands take and write, checked before any work: --model (a checkpoint folder of any
form `train` writes, its config and tokenizer read once, the task it was trained for), train's --output folder and
predict's --output file.
"""

from pathlib import Path

from ..modeling_files import MERGED, folder_form
from .distributed import refuse_if_locked
from .errors import CliError
from .tasks import for_model


def check_model_path(model: str, gguf_file: str | None) -> None:
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        raise CliError(f"--model {model} is a GGUF file: pass its folder as --model and the name as --gguf-file")
    if path.exists() and not path.is_dir():
        raise CliError(f"--model {model}: not a checkpoint folder")
    if path.is_dir() and folder_form(path) == MERGED:
        wanted = path / gguf_file if gguf_file else path / "config.json"
        if not wanted.is_file():
            raise CliError(
                f"--model {model}: not a checkpoint (no {wanted.name}); point at a folder from save_pretrained"
            )


def load_tokenizer(model: str, gguf_file=None, config=None):
    """The folder's tokenizer (`config`: the folder's config, read already, so that it is not read again)."""
    from transformers import AutoTokenizer

    where = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(model, **where, **({"config": config} if config is not None else {}))
    except (OSError, ValueError) as error:
        raise CliError(f"--model {model}: no tokenizer could be loaded ({str(error).splitlines()[0]})") from None


def model_config(model: str):
    """The config of a folder `train` saved, of any form (an adapter's stable_config.json), checked; a generative
    folder is refused with the loader that loads it (stable_models.loading)."""
    from ..loading import folder_config

    check_model_path(model, None)
    if not Path(model).is_dir():
        raise CliError(f"--model {model}: no such folder")
    try:
        return folder_config(model)
    except (OSError, ValueError, KeyError) as error:
        raise CliError(f"--model {model}: {str(error).splitlines()[0]}") from None


def task_of_folder(config, model: str):
    """The task a saved folder was trained for (its config says), whose model kind checks that it is a trained
    folder of that kind (a merged folder: not a base causal LM)."""
    task = for_model(config)
    if folder_form(model) == MERGED:
        try:
            task.model_kind.check_trained(config)
        except ValueError as error:
            raise CliError(f"--model {model}: {error}") from None
    return task


def config_and_tokenizer(model: str):
    """A saved folder's config (checked) and tokenizer, without its weights: enough to read, check and render the
    data, so a bad row stops evaluate and predict before the weights load."""
    from ..tokenization import setup_pad_token

    config = model_config(model)
    tokenizer = load_tokenizer(model, config=config if folder_form(model) == MERGED else None)
    if tokenizer.pad_token_id is None:
        setup_pad_token(tokenizer)
    return config, tokenizer


def check_output_dir(output: Path, overwrite: bool, resume: bool) -> None:
    if output.exists() and not output.is_dir():
        raise CliError(f"--output {output} is a file; give a directory")
    if output.is_dir():
        refuse_if_locked(output)
    if output.is_dir() and any(output.iterdir()) and not (overwrite or resume):
        raise CliError(f"--output {output} exists and is not empty; pass --overwrite, --resume, or another directory")


def check_prediction_file(output: Path, overwrite: bool) -> None:
    if output.suffix not in (".jsonl", ".csv", ".parquet"):
        raise CliError(f"--output {output}: use a .jsonl, .csv or .parquet file")
    if output.exists() and not overwrite:
        raise CliError(f"--output {output} exists; pass --overwrite or another file")
