"""The documentation: README.md stays short (what tidepool is, the two commands, the picture, using it, links)
and every link it gives resolves; the site in docs/ (mkdocs.yml) builds with `mkdocs build --strict`, which
fails on a link to a missing page or anchor (mkdocs.yml's `validation`) or a page left out of the nav."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 400
# An inline Markdown link or image: [text](target) or [text](target "title").
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def relative_links(markdown: str) -> list[str]:
    """The targets of the links that point into the repository (no scheme, not a bare #anchor), outside
    fenced code blocks."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return [t for t in LINK.findall(prose) if not SCHEME.match(t) and not t.startswith("#")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built strictly into a temporary directory (never into the repository's `site/`)."""
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    return out


def test_the_documentation_site_builds_strictly_with_no_broken_link(site: Path) -> None:
    assert (site / "index.html").is_file()
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if not (site / ("" if p == "index" else p) / "index.html").is_file()] == []


def test_the_readme_has_at_most_400_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_every_relative_link_in_the_readme_points_to_a_file_that_exists() -> None:
    links = relative_links(README.read_text())
    assert links, "README.md links into docs/"
    missing = [t for t in links if not (ROOT / unquote(t.split("#")[0].split("?")[0])).exists()]
    assert missing == []


def test_every_anchor_the_readme_links_to_in_docs_is_a_heading_of_the_built_page(site: Path) -> None:
    missing = []
    for target in relative_links(README.read_text()):
        path, _, anchor = target.partition("#")
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            page = Path(path).relative_to("docs").with_suffix("")
            html = (site / ("" if page.name == "index" else page) / "index.html").read_text()
            if f'id="{anchor}"' not in html:
                missing.append(target)
    assert missing == []


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        pytest.param("[a](docs/x.md) and ![b](img.png)", ["docs/x.md", "img.png"], id="links and images"),
        pytest.param("[a](docs/x.md#y \"title\")", ["docs/x.md#y"], id="a title is not part of the target"),
        pytest.param("[a](https://x.io) [b](mailto:a@b) [c](#here)", [], id="urls and bare anchors are not files"),
        pytest.param("```\n[a](nowhere.md)\n```\n[b](here.md)", ["here.md"], id="links in code blocks are code"),
    ],
)  # fmt: skip
def test_relative_links_are_the_links_into_the_repository(markdown: str, expected: list[str]) -> None:
    assert relative_links(markdown) == expected
