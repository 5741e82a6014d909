"""The reference pages stay complete: every `kurir` command is in docs/cli.md, and the README
stays a front page (short, pointing at pages that exist)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from app.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _command_paths(group: click.Group, prefix: str = "kurir") -> list[str]:
    paths = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            paths += _command_paths(command, path)
        else:
            paths.append(path)
    return paths


def test_every_command_is_in_the_cli_page() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    missing = [path for path in _command_paths(cli) if f"`{path}" not in page]
    assert missing == []


def test_the_command_list_is_read_from_the_real_cli() -> None:
    """The check above must be able to fail: it sees nested commands."""
    paths = _command_paths(cli)
    assert "kurir dlq resend" in paths and "kurir up" in paths and len(paths) > 15


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links, "the README links to its pages"
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_docs_link_to_pages_that_exist() -> None:
    broken = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / link).exists():
                broken.append(f"{page.name} -> {link}")
    assert broken == []
