"""mkdocs hooks (mkdocs.yml): the README becomes the site's home page and the CHANGELOG a page, both read from the
repository's root as GitHub shows them; links between the root and docs/ are rewritten to the site's pages."""

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
ROOT_PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}


def on_files(files, config):
    for source, page in ROOT_PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / source).read_text()))
    return files


def on_page_markdown(markdown, page, config, files):
    for source, target in ROOT_PAGES.items():
        markdown = markdown.replace(f"](../{source}", f"]({target}")
        if page.file.src_uri in ROOT_PAGES.values():
            markdown = markdown.replace(f"]({source}", f"]({target}")
    if page.file.src_uri in ROOT_PAGES.values():  # the README links docs/x.md; inside the site x.md is beside it
        markdown = re.sub(r"\]\(docs/", "](", markdown)
    return markdown
