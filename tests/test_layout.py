"""The house rules.

The remote-code rule: save_pretrained copies the class's file, modeling_stable.py, and every file it imports as
`from .x import` (transformers' rule), flat. So the core is modeling_stable.py plus its `modeling_*` siblings, and each
of them may import only torch, transformers, the standard library and those siblings.

One direction of imports: no circle among the package's modules, and the core imports nothing else of the package.
"""

import ast
import re
import subprocess
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


def module_name(path: Path) -> str:
    """`cli/data` for stable_models/cli/data.py: the names the map in docs/development.md uses."""
    return path.relative_to(PACKAGE).with_suffix("").as_posix()


def package_imports(path: Path) -> set[str]:
    """The package modules a module imports, at any depth of its code (imports inside functions count)."""
    here = module_name(path).split("/")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - node.level + 1]
            if node.module is None:
                found |= {"/".join([*base, alias.name]) for alias in node.names}
            else:
                found.add("/".join([*base, *node.module.split(".")]))
        elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "stable_models":
            found.add("/".join(node.module.split(".")[1:]) or "__init__")
        elif isinstance(node, ast.Import):
            found |= {
                "/".join(a.name.split(".")[1:]) or "__init__" for a in node.names if a.name.startswith("stable_models")
            }
    tree = ast.parse(path.read_text())
    if any(isinstance(node, ast.Attribute) and node.attr == "import_module" for node in ast.walk(tree)):
        found |= imported_by_name(tree, here)
    modules = set()
    for name in found:
        if (PACKAGE / f"{name}.py").is_file():
            modules.add(name)
        elif (PACKAGE / name / "__init__.py").is_file():
            modules.add(f"{name}/__init__")
    return modules


def imported_by_name(tree, here: list[str]) -> set[str]:
    """The modules a module imports by name (importlib.import_module): the entries of each of its module-level
    tuples, lists or dicts (values) that all name modules beside it, as `tasks.TASKS` and the package's `PUBLIC` do."""
    siblings = PACKAGE.joinpath(*here)
    found = set()
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        items = value.values if isinstance(value, ast.Dict) else getattr(value, "elts", [])
        names = [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]
        if names and len(names) == len(items) and all((siblings / f"{name}.py").is_file() for name in names):
            found |= {"/".join([*here, name]) for name in names}
    return found


LAYERS = {"**The core**": "core", "**The library**": "library", "**The command line**": "command line"}


def the_map(text: str) -> dict[str, tuple[str, set[str]]]:
    """docs/development.md's tables as {module: (layer, the modules it may import)}."""
    rows, layer = {}, None
    for line in text.splitlines():
        layer = next((name for heading, name in LAYERS.items() if line.startswith(heading)), layer)
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 3 or not cells[0].endswith(".py`"):
            continue
        allowed = set(re.findall(r"`([a-z_/]+)`", cells[2]))
        rows[cells[0].strip("`").removesuffix(".py")] = (layer, allowed, cells[2])
    core = {name for name, (kind, *_) in rows.items() if kind == "core"}
    library = {name for name, (kind, *_) in rows.items() if kind == "library"}
    return {
        name: (
            kind,
            allowed | (core if "the core" in text else set()) | (library | core if "the library" in text else set()),
        )
        for name, (kind, allowed, text) in rows.items()
    }


def map_problems(graph: dict[str, set[str]], rows: dict) -> list[str]:
    problems = [f"{name}: no row in docs/development.md" for name in sorted(set(graph) - set(rows))]
    problems += [f"{name}: a row, but no module" for name in sorted(set(rows) - set(graph))]
    for name, imported in sorted(graph.items()):
        if name not in rows:
            continue
        kind, allowed = rows[name]
        problems += [f"{name} imports {target}, which its row does not allow" for target in sorted(imported - allowed)]
        if kind != "command line":
            problems += [
                f"{name} ({kind}) imports the command line ({target})"
                for target in sorted(imported)
                if rows.get(target, ("command line",))[0] == "command line"
            ]
    return problems


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
    """Every modeling_* file is reached by relative imports from the file a saved folder's auto_map names:
    modeling_stable.py (classifiers) or modeling_embedding.py (embedders, which build on the classifiers), so each
    travels with a checkpoint; nothing else is."""
    reached = set(code_files(str(PACKAGE), "modeling_stable.py")) | set(
        code_files(str(PACKAGE), "modeling_embedding.py")
    )
    assert sorted(reached) == [path.name for path in MODELING_FILES]
    assert set(code_files(str(PACKAGE), "modeling_embedding.py")) >= set(code_files(str(PACKAGE), "modeling_stable.py"))


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


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): package_imports(path) for path in PACKAGE.rglob("*.py")}


def test_no_import_circles():
    graph = import_graph()
    assert graph["cli/doctor"] >= {"cli/logs"}  # the doctor reads logs; logs import neither the doctor nor the CLI
    assert graph["cli/tasks"] >= {"cli/classification", "cli/preference", "cli/ranking"}  # imported by name
    assert graph["cli/logs"].isdisjoint({"cli/doctor", "cli/__init__"})
    assert import_cycles(graph) == []


def test_every_import_is_one_the_map_in_the_docs_allows():
    """docs/development.md is the map: a row per module, what each may import, and no import of the command line
    from the library or the core."""
    rows = the_map((PACKAGE.parent / "docs" / "development.md").read_text())
    assert {kind for kind, _ in rows.values()} == {"core", "library", "command line"}
    assert map_problems(import_graph(), rows) == []


def test_the_map_check_catches_a_library_module_importing_the_command_line():
    rows = {"registry": ("library", {"cli/data"}), "cli/data": ("command line", set()), "labels": ("library", set())}
    graph = {"registry": {"cli/data", "labels"}, "cli/data": set(), "metrics": set()}
    assert map_problems(graph, rows) == [
        "metrics: no row in docs/development.md",
        "labels: a row, but no module",
        "registry imports labels, which its row does not allow",
        "registry (library) imports the command line (cli/data)",
    ]


def test_the_package_resolves_public_names_from_the_library_only():
    import stable_models

    rows = the_map((PACKAGE.parent / "docs" / "development.md").read_text())

    def row(module):  # `losses.listwise` -> `losses/listwise`; a package -> its __init__
        name = module.replace(".", "/")
        return name if name in rows else f"{name}/__init__"

    assert {rows[row(module)][0] for module in stable_models.PUBLIC.values()} <= {"core", "library"}
    for name in stable_models.__all__:  # each resolves to the object its module defines
        value = getattr(stable_models, name)
        assert getattr(value, "__module__", f"stable_models.{stable_models.PUBLIC[name]}") == (
            f"stable_models.{stable_models.PUBLIC[name]}"
        ), name


def test_help_and_argument_errors_import_neither_torch_nor_transformers():
    """`stable-models --help`, each command's --help and an argument error parse before anything heavy is imported
    (the package's __init__ included), so they answer at once."""
    code = """
import sys
from stable_models.cli import main
for argv in (["--help"], ["train", "--help"], ["evaluate", "--help"], ["predict", "--help"], ["verify", "--help"],
             ["doctor", "--help"], ["train", "--no-such-option"], ["predict", "--engine", "tpu"], []):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(m for m in ("torch", "transformers", "datasets", "peft", "numpy") if m in sys.modules)
print("HEAVY", heavy)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "usage: stable-models" in done.stdout and "usage: python -m stable_models doctor" in done.stdout
    assert "invalid choice: 'tpu'" in done.stderr
    assert done.stdout.strip().splitlines()[-1] == "HEAVY []", done.stdout[-500:] + done.stderr[-2000:]


def test_the_cycle_finder_finds_circles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_tree_passes_the_linter_ci_runs():
    """CI runs `ruff check .` after the tests; checking here too makes `./dev test` fail where CI would."""
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", str(PACKAGE.parent)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pre_flight_and_the_doctor_share_one_numerics_check():
    """train's pre-flight and the doctor judge a model by the library's one check (stable_models.numerics), not by
    copies of it: both import it, and neither defines a tolerance of its own."""
    graph = import_graph()  # the pre-flight is the model kind's (model_kinds), which judges by numerics
    assert "model_kinds" in graph["cli/task_steps"] and "numerics" in graph["model_kinds"]
    assert "numerics" in graph["cli/doctor"]
    for module in ("cli/commands", "model_kinds", "cli/doctor"):
        tree = ast.parse((PACKAGE / f"{module}.py").read_text())
        assigned = {
            t.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        assert "PADDING_TOLERANCE" not in assigned, module
