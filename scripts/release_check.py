"""The release, as a user gets it (`./dev release-check`; CI runs it):

1. `python -m build`: the sdist and the wheel; `twine check --strict` on both; the wheel carries the code-file hashes
   of this version (`code_hashes.json`), the modeling files and the command line.
2. A fresh venv, away from the clone (its folder is not on the path): the CPU torch, then the wheel with the `cli`
   extra. There: the README's usage snippet on a tiny Qwen2 folder, `stable-models --help`, and `stable-models verify`
   of a folder that snippet's model saved, which must name this version.
3. The README's install lines, run as written from the clone's folder in another fresh venv (the line with a
   placeholder URL is skipped), then `import stable_models` from elsewhere.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the CPU build this machine's pip takes


def run(command, **kwargs):
    print("[release-check] $", " ".join(map(str, command)), flush=True)
    return subprocess.run([str(c) for c in command], check=True, **kwargs)


def fresh_venv(folder: Path) -> Path:
    run([sys.executable, "-m", "venv", folder])
    python = folder / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", TORCH])
    return python


def readme_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def build(out: Path) -> tuple[Path, Path]:
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], stdout=subprocess.DEVNULL)
    wheel, sdist = next(out.glob("*.whl")), next(out.glob("*.tar.gz"))
    run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist])
    version = re.search(r'__version__ = "(.*?)"', (ROOT / "stable_models" / "__init__.py").read_text()).group(1)
    assert f"-{version}-" in wheel.name, (wheel.name, version)
    names = zipfile.ZipFile(wheel).namelist()
    sources = [p.relative_to(ROOT).as_posix() for p in (ROOT / "stable_models").rglob("*.py")]
    for needed in ("stable_models/code_hashes.json", *sources):  # every module: a subpackage left out of pyproject
        assert needed in names, f"the wheel lacks {needed}"
    recorded = json.loads(zipfile.ZipFile(wheel).read("stable_models/code_hashes.json"))
    assert version in recorded, f"code_hashes.json has no {version}: python scripts/record_code_hashes.py"
    return wheel, version


SNIPPET_SETUP = """
import sys
import stable_models
assert "site-packages" in stable_models.__file__, stable_models.__file__  # the wheel, not the clone
sys.path.insert(0, {tests!r})  # the tiny tokenizer builder only (it imports tokenizers and transformers)
from tiny_tokenizers import qwen2_like
from transformers import Qwen2Config, Qwen2ForCausalLM

tokenizer = qwen2_like()
config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, pad_token_id=tokenizer.pad_token_id)
Qwen2ForCausalLM(config).save_pretrained({folder!r})
tokenizer.save_pretrained({folder!r})
"""


def check_wheel(tmp: Path, wheel: Path, version: str) -> None:
    python = fresh_venv(tmp / "venv-wheel")
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[cli]", TORCH], cwd=tmp)
    snippet = readme_blocks("python")[0].replace("path/to/Qwen2.5-0.5B", str(tmp / "qwen2"))
    program = SNIPPET_SETUP.format(tests=str(ROOT / "tests"), folder=str(tmp / "qwen2")) + snippet
    program += f"\nassert out.logits.dtype == torch.float32\nmodel.save_pretrained({str(tmp / 'saved')!r})\n"
    (tmp / "snippet.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    run([python, tmp / "snippet.py"], cwd=tmp, env=env)
    run([tmp / "venv-wheel" / "bin" / "stable-models", "--help"], cwd=tmp, env=env, stdout=subprocess.DEVNULL)
    verified = run(
        [tmp / "venv-wheel" / "bin" / "stable-models", "verify", tmp / "saved"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert f"byte-identical to stable_models {version}'s" in verified, verified


def check_install_lines(tmp: Path) -> None:
    python = fresh_venv(tmp / "venv-readme")
    block = next(b for b in readme_blocks("bash") if b.lstrip().startswith("pip install"))
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words or "<" in line.split("#")[0]:  # a placeholder to fill in
            continue
        assert words[:2] == ["pip", "install"], line
        run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *words[2:]], cwd=ROOT)
    run([python, "-c", "import stable_models, stable_models.cli; print(stable_models.__version__)"], cwd=tmp)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="release-check-") as folder:
        tmp = Path(folder)
        wheel, version = build(tmp / "dist")
        check_wheel(tmp, wheel, version)
        check_install_lines(tmp)
    print(f"[release-check] stable_models {version}: sdist and wheel build, pass twine; the wheel installs and runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
