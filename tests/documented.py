"""The documented pages, the README first and then every page of docs/, and their code blocks: the tests run every
documented command and snippet from here, wherever a page keeps it (scripts/readme_outputs.py reads them too)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(kind: str, pages=PAGES) -> list[str]:
    """The ```kind fenced blocks of the pages, in page order."""
    return [block for page in pages for block in re.findall(rf"```{kind}\n(.*?)```", Path(page).read_text(), re.S)]


def commands(marker: str, pages=PAGES) -> list[str]:
    """The `stable-models ...` lines of the first bash block that holds `marker`."""
    block = next(b for b in blocks("bash", pages) if marker in b)
    return [line for line in block.splitlines() if line.startswith("stable-models ")]
