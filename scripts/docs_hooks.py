"""MkDocs hooks (mkdocs.yml): the site's front page is the README itself.

`docs/index.md` includes nothing of its own: on_page_markdown gives it README.md's text, with the
README's links into `docs/` made relative to the site's root, so the front page on GitHub and on
the site is one text that cannot drift."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    return re.sub(r"\]\(docs/", "](", README.read_text(encoding="utf-8"))
