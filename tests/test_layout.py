"""The house rules.

The remote-code rule: save_pretrained copies the class's file, modeling_stable.py, and every file it imports as
`from .x import` (transformers' rule), flat. So the core is modeling_stable.py plus its `modeling_*` siblings, and each
of them may import only torch, transformers, the standard library and those siblings.

One direction of imports: no circle among the package's modules, and the core imports nothing else of the package.
"""

import ast
import sys
from pathlib import Path

import pytest

from stable_models.modeling_files import code_files

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


def package_imports(path: Path) -> set[str]:
    """The package modules a module imports, at any depth of its code (imports inside functions count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {alias.name for alias in node.names} if node.module is None else {node.module}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "stable_models":
            found.add(node.module.split(".")[1] if "." in node.module else "__init__")
        elif isinstance(node, ast.Import):
            found |= {"__init__" for alias in node.names if alias.name == "stable_models"}
    return {name for name in found if (PACKAGE / f"{name}.py").is_file()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle in the graph, each as the path that closes it (depth-first search)."""
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_core_is_what_save_pretrained_copies():
    """Every modeling_* file is reached from modeling_stable.py by relative imports (so it travels with a
    checkpoint), and nothing else is."""
    assert sorted(code_files(str(PACKAGE), "modeling_stable.py")) == [path.name for path in MODELING_FILES]


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


def test_no_import_circles():
    graph = {path.stem: package_imports(path) for path in PACKAGE.glob("*.py")}
    assert graph["doctor"] >= {"logs"}  # the doctor reads logs; logs import neither the doctor nor the CLI
    assert graph["logs"].isdisjoint({"doctor", "cli"})
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_circles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
