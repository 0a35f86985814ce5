"""The docs name only what exists: every relative Markdown link in README.md and docs/ points at a file of the
repository (and, with ``#anchor``, at one of its headings), and every README section a page names by its quoted
title ("README's "Sweeps"") is a heading of the README. Five pages named sections that had been renamed or removed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_TITLE = re.compile(r"README(?:\.md)?(?:'s)?[ ,(]*(?:section )?\"([^\"]+)\"")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [m.group(1).strip() for m in re.finditer(r"^#+\s+(.*)$", text, re.M)]


def test_slug_as_github_writes_it():
    assert slug("Cross-overs (one algorithm's parts on the other's model)") == \
        "cross-overs-one-algorithms-parts-on-the-others-model"
    assert slug("Quick start (fresh clone, CPU, offline)") == "quick-start-fresh-clone-cpu-offline"
    assert slug("`conf/` files") == "conf-files"


def test_every_relative_link_and_anchor_exists():
    broken = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_readme_section_named_by_title_exists():
    titles = headings(ROOT / "README.md")
    missing = []
    for page in PAGES:
        for name in README_TITLE.findall(page.read_text(encoding="utf-8")):
            if not any(t == name or t.startswith(name) for t in titles):
                missing.append(f"{page.relative_to(ROOT)}: README \"{name}\"")
    assert not missing, "\n".join(missing) + f"\nREADME's sections: {titles}"
