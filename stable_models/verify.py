"""`stable-models verify FOLDER`: is each code file in a saved folder byte-identical to the one a stable_models release
wrote? `AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)` runs those files, so this
is what to check before that call. `stable_models.from_pretrained(folder)` runs none of them (it builds the class from
the installed package), which makes the check unnecessary where stable_models is installed.

What it proves: every `*.py` in the folder has the sha256 of one release's file of that name (the hashes ship with
the package, `code_hashes.json`; the installed version's own files count too), all from one release, and none is
missing. What it does not: anything about the weights, the tokenizer or the config, which are data, not code.
"""

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .modeling_files import CODE_VERSION, auto_map_target, check_saved_folder, code_files

MANIFEST = Path(__file__).with_name("code_hashes.json")
RECORDED = "stable_models_code_sha256"  # config.json: {file: sha256} of the code files save_pretrained wrote
RECORDED_VERSION = "stable_models_version"


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def installed_code() -> dict[str, str]:
    """{file: sha256} of the code files this installed package writes next to a checkpoint (the core)."""
    package = Path(__file__).parent
    return {p.name: sha256(p) for p in sorted(package.glob("modeling_*.py"))}


def releases() -> dict[str, dict[str, str]]:
    """{version: {file: sha256}}: the released versions' code files, and the installed version's own."""
    known = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    known.setdefault(CODE_VERSION, installed_code())
    return known


@dataclass
class Verdict:
    """The outcome of `verify_folder`: one line per code file, the release they all match (or None), and problems."""

    folder: str
    files: dict = field(default_factory=dict)  # name -> (status, detail)
    version: str | None = None
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        out = [f"{name}: {status}{f' ({detail})' if detail else ''}" for name, (status, detail) in self.files.items()]
        if not self.files:
            out.append("no code files: nothing in this folder runs with trust_remote_code=True")
        if self.ok and self.files:
            out.append(f"verified: every code file is byte-identical to stable_models {self.version}'s")
        out += [f"not verified: {p}" for p in self.problems]
        return out


def verify_folder(folder) -> Verdict:
    """Each `*.py` in `folder` (and each file the auto_map's module imports, or config.json records) against the
    released code files: `matches`, `modified` (a release's file name, other bytes), `unknown` (no release has such a
    file), `missing`."""
    folder = str(folder)
    verdict = Verdict(folder)
    config = {}
    if os.path.isfile(os.path.join(folder, "config.json")):
        with open(os.path.join(folder, "config.json")) as handle:
            config = json.load(handle)
    needed = set()
    target = auto_map_target(config)
    if target:
        needed |= set(code_files(folder, target.split("--")[-1].rsplit(".", 1)[0] + ".py"))
    recorded = config.get(RECORDED) or {}
    present = {name for name in os.listdir(folder) if name.endswith(".py")}
    known = releases()
    names = {name for files in known.values() for name in files}
    common = None
    for name in sorted(present | needed | set(recorded)):
        if name not in present:
            verdict.files[name] = (
                "missing",
                "the auto_map's code imports it" if name in needed else "config.json lists it",
            )
            verdict.problems.append(f"{name} is missing")
            continue
        digest = sha256(os.path.join(folder, name))
        versions = [version for version, files in known.items() if files.get(name) == digest]
        if not versions:
            status = "modified" if name in names else "unknown"
            detail = "its bytes match no release's" if status == "modified" else "no release of stable_models has it"
            verdict.files[name] = (status, f"sha256 {digest[:16]}..., {detail}")
            verdict.problems.append(f"{name} is {status}")
            continue
        if name in recorded and recorded[name] != digest:
            verdict.files[name] = ("replaced", f"matches {', '.join(versions)}, not the sha256 config.json records")
            verdict.problems.append(f"{name} is not the file this folder was saved with")
            continue
        verdict.files[name] = ("matches", ", ".join(versions))
        common = set(versions) if common is None else common & set(versions)
    if verdict.ok and verdict.files:
        if not common:
            verdict.problems.append("the code files come from different releases")
        else:
            verdict.version = max(common, key=version_key)
    return verdict


def version_key(version: str) -> tuple:
    return tuple(int(part) if part.isdigit() else -1 for part in version.replace("-", ".").split("."))


def check_checkpoint(folder: str, require_auto_map: bool = True, pooling: str | None = None) -> None:
    """Raise a ValueError naming the file and the fix if a saved folder cannot load as a Stable model, and, with
    `require_auto_map` (the trust_remote_code path), if a code file is not a release's (`stable-models verify`)."""
    check_saved_folder(folder, require_auto_map=require_auto_map, pooling=pooling)
    if require_auto_map:
        verdict = verify_folder(folder)
        if not verdict.ok:
            raise ValueError(
                f"{folder}: {verdict.problems[0]}: trust_remote_code=True would run code that is not a stable_models "
                "release's. Load it with stable_models.from_pretrained (runs no code from the folder), or save it "
                "again with stable_models installed; `stable-models verify` lists every file."
            )
