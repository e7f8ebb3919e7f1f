"""The remote-code rule: save_pretrained copies each modeling file and its flat `from .x import` siblings, nothing
else, so every modeling_*.py may import only torch, transformers, the standard library and such siblings."""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "stable_models"
MODELING_FILES = sorted(PACKAGE.glob("modeling_*.py"))
ALLOWED_TOP_LEVEL = {"torch", "transformers"} | set(sys.stdlib_module_names)


def import_problems(path: Path) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            problems += [alias.name for alias in node.names if alias.name.split(".")[0] not in ALLOWED_TOP_LEVEL]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module.split(".")[0] not in ALLOWED_TOP_LEVEL:
                problems.append(node.module)
            elif node.level == 1 and (node.module is None or "." in node.module):
                problems.append("from . import ..." if node.module is None else f"from .{node.module}")
            elif node.level == 1 and not (PACKAGE / f"{node.module}.py").name.startswith("modeling_"):
                problems.append(f"from .{node.module} (only modeling_* siblings are copied)")
            elif node.level > 1:
                problems.append("from .." + (node.module or ""))
    return problems


def test_one_self_contained_modeling_file_serves_every_architecture():
    """Architectures are data (transformers' own mapping), not a copied module each."""
    assert [path.name for path in MODELING_FILES] == ["modeling_stable.py"]


@pytest.mark.parametrize("path", MODELING_FILES, ids=lambda p: p.name)
def test_modeling_file_imports_only_torch_transformers_and_flat_siblings(path):
    assert import_problems(path) == []


def test_the_checker_catches_bad_imports(tmp_path):
    bad = tmp_path / "modeling_bad.py"
    lines = [
        "import numpy",
        "from stable_models.registry import x",
        "from ..a import b",
        "from . import c",
        "from .registry import d",
    ]
    bad.write_text("\n".join(lines) + "\n")
    assert len(import_problems(bad)) == 5
