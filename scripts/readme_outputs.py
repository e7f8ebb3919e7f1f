"""The documented (README and docs/) train / evaluate / predict commands of the three tasks, run on the tests' tiny
fixtures, with every output in one listing: stdout, stderr (without progress bars and timings) and each written file
(JSON as it is, less runtimes; other files by SHA-256). Two listings show whether a change moved any output: a
refactor must leave them equal. `compare` leaves out what a new version changes by itself: the code files a saved
folder carries, and the version and code hashes in its config.json.

    .venv/bin/python scripts/readme_outputs.py run TREE OUT      # TREE: a checkout (a git worktree of a commit)
    .venv/bin/python scripts/readme_outputs.py compare OUT_A OUT_B
"""

import contextlib
import difflib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

VOLATILE = re.compile(r"runtime|per_second|_flos")  # timings in logs and reports
TIMED = re.compile(r"'(\w*runtime|\w*per_second|train_loss)': '[^']*'")  # the same in Trainer's printed dicts


def clean(text: str) -> str:
    kept = []
    for part in re.split(r"[\r\n]", text):
        if "%|" in part or "it/s" in part or "s/it" in part or not part.strip() or part.strip() in ("[A", "\x1b[A"):
            continue
        kept.append(TIMED.sub("<t>", re.sub(r"\d+\.\d+s|/tmp/\S+", "<x>", part)))
    return "\n".join(kept)


def scrub(value):
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not VOLATILE.search(k)}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def run(tree: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    sys.path[:0] = [str(tree), str(tree / "tests")]
    os.chdir(tree / "tests")
    import pandas
    import test_cli
    import test_ranking_cli as ranking
    import test_reward_cli as reward
    import transformers
    from test_doctor import save_checkpoint
    from tiny_tokenizers import qwen2_like

    from stable_models import cli

    transformers.logging.set_verbosity_error()
    listing = {}
    pages = [tree / "README.md", *sorted((tree / "docs").rglob("*.md"))]  # as tests/documented.py reads them
    documented = [b for page in pages for b in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)]

    def commands(marker):
        block = next(b for b in documented if marker in b)
        return [line for line in block.splitlines() if line.startswith("stable-models ")]

    def record(task, folder, marker, base, extra=()):
        for line in commands(marker):
            argv = shlex.split(line.replace("./SmolLM2-135M-Instruct", str(base)))[1:]
            argv += list(extra) if argv[0] == "train" else []
            said, errors = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(errors):
                listing[f"{task}:{argv[0]}:exit"] = cli.main(argv)
            listing[f"{task}:{argv[0]}:stdout"] = clean(said.getvalue())
            listing[f"{task}:{argv[0]}:stderr"] = clean(errors.getvalue())
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and not {"checkpoints", "logs"} & set(p.parts)):
            data = path.read_bytes()
            name = f"{task}:{path.relative_to(folder)}"
            listing[name] = scrub(json.loads(data)) if path.suffix == ".json" else hashlib.sha256(data).hexdigest()
            if path.suffix == ".png":  # matplotlib's bytes vary with its version and fonts
                listing[name] = "png"

    for task in ("classification", "preference", "ranking"):
        folder = out / task
        folder.mkdir(parents=True)
        os.chdir(folder)
        if task == "classification":
            base = save_checkpoint(out / "base-classification", "qwen2", qwen2_like())
            table = pandas.DataFrame(test_cli.rows("string"))
            table.to_csv("reviews.csv", index=False)
            table.to_csv("test.csv", index=False)
            table[["text"]].to_csv("new.csv", index=False)
            record(task, folder, "stable-models train", base)
        elif task == "preference":
            base = save_checkpoint(out / "base-preference", "qwen2", reward.chat_tokenizer())
            reward.write(folder / "pairs.jsonl", reward.pairs("conversational-implicit", 24))
            reward.write(folder / "test_pairs.jsonl", reward.pairs("conversational-explicit", 8))
            answers = [{"prompt": reward.question(i // 3), "text": reward.answer(i, i % 3 != 1)} for i in range(9)]
            reward.write(folder / "answers.jsonl", answers)
            record(task, folder, "--group-key", base)
        else:
            base = save_checkpoint(out / "base-ranking", "qwen2", qwen2_like())
            ranking.write(folder / "groups.jsonl", ranking.layout_rows("flag", ranking.groups(12)))
            ranking.write(folder / "test_groups.jsonl", ranking.layout_rows("tuples", ranking.groups(16)[12:]))
            rows = ranking.layout_rows("pointwise", ranking.groups(2))
            ranking.write(folder / "candidates.jsonl", [{"query": r["query"], "document": r["document"]} for r in rows])
            record(task, folder, "--top-k", base, ranking.FAST)
    (out / "listing.json").write_text(json.dumps(listing, indent=1, sort_keys=True))
    print(f"{len(listing)} outputs -> {out / 'listing.json'}")


VERSIONED = ("stable_models_version", "stable_models_code_sha256")  # config.json keys that follow the code files


def without_version(listing: dict) -> tuple[dict, set]:
    """The listing less what a new version changes by itself (the code files a folder carries, their hashes and the
    version in config.json), and the versions it held."""
    kept, versions = {}, set()
    for key, value in listing.items():
        if re.search(r"/modeling_\w+\.py$", key):
            continue
        if key.endswith("/config.json"):
            versions.add(value.get("stable_models_version"))
            value = {k: v for k, v in value.items() if k not in VERSIONED}
        kept[key] = value
    return kept, versions


def compare(first: Path, second: Path) -> int:
    (a, old), (b, new) = (without_version(json.loads((f / "listing.json").read_text())) for f in (first, second))
    differ = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    for key in differ:
        print(f"differs: {key}")
        if isinstance(a.get(key), str) and isinstance(b.get(key), str):
            print("\n".join(list(difflib.unified_diff(a[key].splitlines(), b[key].splitlines(), lineterm=""))[2:22]))
    print(f"{len(a)} and {len(b)} outputs, {len(differ)} differ (versions {sorted(old)} and {sorted(new)}; the code")
    print("files a saved folder carries, and their hashes in config.json, are left out: they change with the version)")
    return 1 if differ else 0


if __name__ == "__main__":
    command, first, second = sys.argv[1], Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve()
    sys.exit(run(first, second) if command == "run" else compare(first, second))
