"""Fetch transformers' own common model tests for the installed release, so tests/test_transformers_common.py can run
them against the Stable classes beside the stock ones.

The wheel carries no tests; the sdist on PyPI carries `tests/test_modeling_common.py` (not the per-model tests). It is
unpacked into `<venv>/transformers_tests/<version>/hf_tests/` with empty stand-ins for the two mixins it imports from
folders the sdist leaves out (export and generation tests, which no classifier check here uses). Cached per version;
./dev runs this after installing.
"""

import os
import subprocess
import sys
import tarfile
import tempfile

import transformers

STAND_INS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
}


def tests_folder(version: str = transformers.__version__) -> str:
    """Where the package `hf_tests` for this transformers version lives (its parent goes on sys.path)."""
    return os.path.join(sys.prefix, "transformers_tests", version)


def fetch(version: str = transformers.__version__) -> str:
    root = tests_folder(version)
    package = os.path.join(root, "hf_tests")
    if os.path.isfile(os.path.join(package, "test_modeling_common.py")):
        return root
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", ":all:", f"transformers=={version}", "-d", download],
            check=True,
        )  # fmt: skip
        (archive,) = os.listdir(download)
        with tarfile.open(os.path.join(download, archive)) as sdist:
            member = sdist.getmember(f"transformers-{version}/tests/test_modeling_common.py")
            source = sdist.extractfile(member).read().decode()
    os.makedirs(package, exist_ok=True)
    for name, text in {"__init__.py": "", "test_modeling_common.py": source, **STAND_INS}.items():
        path = os.path.join(package, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.dirname(name):
            open(os.path.join(os.path.dirname(path), "__init__.py"), "a").close()
        with open(path, "w") as handle:
            handle.write(text)
    return root


if __name__ == "__main__":
    print(f"[dev] transformers {transformers.__version__} common model tests in {fetch()}", file=sys.stderr)
