"""The layers hold: faces call services, services never import a web or CLI framework.

Read from the source (imports anywhere in a module, including inside functions), so a shortcut
taken in a hurry fails here rather than in a review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a face may not reach around the services for.
PIPELINES = ("sender", "dlq", "app.inbound", "app.accounts", "app.contracts")
# Process entry points start the pipelines' long-running loops, and `kurir listen` is a
# local receiver that only checks a signature: neither changes any state.
FACE_EXCEPTIONS = {
    "app/cli/run.py": {"sender.worker"},
    "app/cli/listen.py": {"app.inbound.verify"},
}
FRAMEWORKS = ("flask", "werkzeug", "click", "jinja2", "gunicorn")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _hits(imported: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {name for name in imported
            if any(name == p or name.startswith(p + ".") for p in prefixes)}


@pytest.mark.parametrize("path", _modules("app/web", "app/cli"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_faces_call_services_not_the_pipelines(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    allowed = FACE_EXCEPTIONS.get(relative, set())
    reached = {name for name in _hits(_imports(path), PIPELINES)
               if not any(name == a or name.startswith(a + ".") for a in allowed)}
    assert not reached, f"{relative} reaches around app.services: {sorted(reached)}"


@pytest.mark.parametrize("path", _modules("app/services"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_services_import_no_framework(path: Path) -> None:
    found = _hits(_imports(path), FRAMEWORKS) | _hits(_imports(path), ("app.web", "app.cli"))
    assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def test_the_check_sees_a_violation():
    """The test above must be able to fail: a face importing a pipeline is caught."""
    sample = ROOT / "app/web/api/partners.py"
    assert _hits(_imports(sample) | {"sender.endpoints"}, PIPELINES) == {"sender.endpoints"}
