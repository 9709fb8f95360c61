"""Every relative link in README.md, CONTRIBUTING.md and docs/ points at a file that exists and,
with a fragment, at one of that file's headings (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, no punctuation, spaces to hyphens, -1 on a repeat."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_checker_finds_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Serving: `dpsql serve`\n\n## Budget periods\n[a](#budget-periods) [b](#no)")
    assert _anchors(page) == {"serving-dpsql-serve", "budget-periods"}
    assert _links(page) == ["#budget-periods", "#no"]
