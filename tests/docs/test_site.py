"""The docs site (mkdocs.yml, docs/): it builds with --strict, so a broken link or anchor between
pages, or a page left out of the navigation, fails the tests; its front page is the README."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_with_the_readme_as_its_front_page(built_site: Path) -> None:
    site = built_site  # built with --strict (conftest): a warning would have failed it
    front = (site / "index.html").read_text(encoding="utf-8")
    # The README's text, its links into docs/ made the site's own.
    assert "make serve" in front and "make test" in front
    assert 'href="serve/repository/"' in front
    for page in ("get-started", "call/sagemaker", "deploy/plan", "reference/cli", "architecture"):
        assert (site / page / "index.html").is_file(), page


def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    assert "```bash\nmake serve\n```" in readme and "```bash\nmake test\n```" in readme
