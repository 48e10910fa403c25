"""Every relative link in README.md and docs/*.md points to a file that exists, and its #anchor (if any)
to a heading of that Markdown file (GitHub's anchor rules)."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(md: Path) -> set[str]:
    text = FENCE.sub("", md.read_text())
    out, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(md: Path):
    text = FENCE.sub("", md.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading #{frag} in {dest.name}")
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_anchor_slugs_follow_github():
    md = REPO / "docs" / "orphans.md"
    assert "ownership-cgroups" in anchors(md)  # "## Ownership (cgroups)"
