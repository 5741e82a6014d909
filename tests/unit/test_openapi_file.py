"""The committed `docs/openapi.json` is what the code serves, and each module of routes has its
part of the description beside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.web import openapi
from app.web.openapi import COMMITTED_PATH, render

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m app.web.openapi --write"


def test_the_committed_document_is_what_the_code_serves() -> None:
    committed = (ROOT / COMMITTED_PATH).read_text(encoding="utf-8")
    assert committed == render(), (
        f"{COMMITTED_PATH} is out of date with the API description in the code; "
        f"regenerate it with `{REGENERATE}` and commit it"
    )


def _route_modules() -> list[Path]:
    """Every module that declares Flask routes under app/web/api, and the inbound door."""
    found = []
    for path in sorted((ROOT / "app/web/api").glob("*.py")) + [ROOT / "app/web/inbound.py"]:
        source = path.read_text()
        if "@blueprint." in source:
            found.append(path)
    return found


def _imported_parts() -> set[str]:
    """The `_doc` modules `_load_parts` imports, read from its source."""
    tree = ast.parse(Path(openapi.__file__).read_text())
    load = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "_load_parts"
    )
    names: set[str] = set()
    for node in ast.walk(load):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", _route_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_of_routes_has_its_part_of_the_description(path: Path) -> None:
    part = path.with_name(f"{path.stem}_doc.py")
    assert part.exists(), f"{path.relative_to(ROOT)} has no {part.name} describing its routes"
    module = ".".join(part.relative_to(ROOT).with_suffix("").parts)
    assert module in _imported_parts(), f"app.web.openapi._load_parts does not import {module}"


def test_an_operation_under_an_undeclared_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="undeclared tag"):
        openapi.add(
            "/v1/nowhere",
            "get",
            openapi.op("nothing", tag="no-such-tag", scope="read", ok={200: None}),
        )
    assert "/v1/nowhere" not in openapi.PATHS
