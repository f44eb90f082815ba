"""The README and docs/ hold together: a short README, every page reachable, no dead links (no model)."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s[^)]*)?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def prose(text: str) -> str:
    """The text outside fenced code blocks, where a bracket is not a link."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z]+:", t)]


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail to a page in docs/ and link it"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in relative_links(README) if t.split("#")[0]}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages that no link in README.md reaches: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    dead = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        missing_anchor = bool(anchor) and dest.suffix == ".md" and dest.exists() and anchor not in anchors(dest)
        if not dest.exists() or missing_anchor:
            dead.append(target)
    assert not dead, f"{page.relative_to(ROOT)}: links to nothing: {dead}"


def test_the_readme_test_command_is_make_test():
    # CI (.ci/run) runs the README's test command; the two must stay the same command.
    readme = README.read_text()
    assert re.search(r"^make test\s+#", readme, re.M), "README.md no longer shows `make test` as a command"
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M), ".ci/run does not run `make test`"


def test_slug_follows_github():
    assert slug("edgeinfer against llama.cpp's llama-server") == "edgeinfer-against-llamacpps-llama-server"
    assert slug("Python outside `llama_decode`") == "python-outside-llama_decode"
    assert slug("Constrained answers within max_tokens") == "constrained-answers-within-max_tokens"
