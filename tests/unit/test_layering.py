"""The declared layer graph holds over every module of `app`, `sender` and `dlq`.

Read from the source (imports anywhere in a module, including inside functions), so a shortcut
taken in a hurry fails here rather than in a review. `docs/architecture.md` draws the same map.

A module may import its own package, anything in a lower layer that its layer lists, and the
few peer edges declared below. Faces (the API, UI, portal and CLI) reach the system through
`app.services` only, and build no SQL of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Which package (the unit the graph is drawn between) each module belongs to.
UNITS = {
    "core": (
        "app.config",
        "app.clock",
        "app.crypto",
        "app.db",
        "app.budget",
        "app.doctor",
        "app.errors",
        "app.headers",
        "app.ids",
        "app.jsonstrict",
        "app.logs",
        "app.migrate",
        "app.models",
        "app.pagination",
        "app.ports",
        "app.queues",
        "app.runtime",
        "app.embedded_redis",
        "app.redis_client",
        "app.signing",
        "app.telemetry",
        "app.vocabulary",
        "app.cache",
        "app",
    ),
    "app.net": ("app.net",),
    "domain": ("app.accounts", "app.event_types"),
    "app.registry": ("app.registry",),
    "app.feed": ("app.feed",),
    "app.lifecycle": ("app.lifecycle",),
    "sender": ("sender",),
    "app.intake": ("app.intake",),
    "app.operational": ("app.operational",),
    "dlq": ("dlq",),
    "app.inbound": ("app.inbound",),
    "app.recovery": ("app.recovery",),
    "app.services": ("app.services",),
    "app.processes": ("app.processes",),
    "app.web": ("app.web",),
    "app.cli": ("app.cli",),
}
PIPELINES = (
    "app.registry",
    "app.feed",
    "sender",
    "app.intake",
    "app.operational",
    "dlq",
    "app.inbound",
    "app.recovery",
    "app.lifecycle",
)
FACES = ("app.web", "app.cli")
BELOW_PIPELINES = ("core", "app.net", "domain")

# What each unit may import besides itself.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "app.net": {"core"},
    "domain": {"core"},
    **{pipeline: set(BELOW_PIPELINES) for pipeline in PIPELINES},
    "app.services": {*BELOW_PIPELINES, *PIPELINES},
    "app.processes": {*BELOW_PIPELINES, *PIPELINES, "app.services"},
    "app.web": {"core", "app.services"},
    "app.cli": {"core", "app.services", "app.web"},
}
# The peer edges between pipelines, one way each: intake hands its deliveries to sending;
# dead letters are resent by sending; a pull endpoint starts at the feed's head; recovery
# signs its probes as sending does, replays what was parked through the dead letters and says
# so with an operational event;
# sending records operational events, which the intake publishes to the operator endpoints
# that `app.operational` keeps through the registry; retention records in the feed how far
# it purged it.
PEER_EDGES = {
    ("app.recovery", "sender"),
    ("app.recovery", "dlq"),
    ("app.recovery", "app.operational"),
    ("app.lifecycle", "app.feed"),
    ("app.intake", "sender"),
    ("app.intake", "app.registry"),
    ("dlq", "sender"),
    ("app.registry", "app.feed"),
    ("sender", "app.operational"),
    ("app.intake", "app.operational"),
    ("app.operational", "app.registry"),
}
# Single modules allowed one edge their unit is not: process entry points start the loops,
# `kurir listen` is a local receiver that only checks a signature, and the parts of the API
# description for event types and endpoints quote the contract and downgrade limits they
# document.
MODULE_EXCEPTIONS = {
    "app.cli.run": {"app.processes"},
    "app.cli.listen": {"app.inbound"},
    "app.web.api.event_types_doc": {"domain"},
    "app.web.api.partners_doc": {"domain"},
}
# SQL a face must not build: reads and writes belong in a service.
QUERY_BUILDERS = {
    f"sqlalchemy.{name}"
    for name in (
        "select",
        "insert",
        "update",
        "delete",
        "func",
        "text",
        "case",
        "and_",
        "or_",
        "exists",
        "literal",
        "union",
        "union_all",
    )
}


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


def unit_of(module: str) -> str | None:
    """The unit a dotted name belongs to (the longest declared prefix), None outside Kurir."""
    best: tuple[int, str] | None = None
    for unit, prefixes in UNITS.items():
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), unit)
    return best[1] if best else None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> list[Path]:
    return sorted(p for folder in ("app", "sender", "dlq") for p in (ROOT / folder).rglob("*.py"))


def violations(module: str, imported: set[str]) -> list[str]:
    """Every import of `module` that the declared graph does not allow."""
    source = unit_of(module)
    assert source is not None, f"{module} belongs to no declared unit: add it to UNITS"
    allowed = ALLOWED[source] | {b for a, b in PEER_EDGES if a == source}
    allowed |= MODULE_EXCEPTIONS.get(module, set())
    found = []
    for name in sorted(imported):
        target = unit_of(name)
        if target is None or target == source:
            continue
        if target not in allowed:
            found.append(f"{name} ({source} -> {target})")
    if source in FACES:
        found += [f"{name} (a face builds SQL)" for name in sorted(imported & QUERY_BUILDERS)]
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_keeps_to_the_declared_graph(path: Path) -> None:
    module = _module_name(path)
    assert not violations(module, _imports(path)), f"{module} breaks the layer graph"


def test_the_graph_has_no_cycle() -> None:
    """Allowed edges only point down: a unit never reaches back to one that may import it."""
    edges = {(a, b) for a, targets in ALLOWED.items() for b in targets} | PEER_EDGES
    for a, b in edges:
        assert (b, a) not in edges, f"{a} and {b} may import each other"


def test_each_module_exception_names_a_module_that_still_needs_it() -> None:
    """A renamed or cleaned-up module must take its exception with it, not leave it open."""
    for module, units in MODULE_EXCEPTIONS.items():
        base = ROOT / module.replace(".", "/")
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        assert path.exists(), f"MODULE_EXCEPTIONS names {module}, which does not exist"
        used = {unit_of(name) for name in _imports(path)}
        assert units <= used, f"{module} no longer imports {sorted(units - used)}: drop it"


def test_the_check_sees_each_kind_of_violation() -> None:
    """The graph test must be able to fail."""
    assert violations("app.web.api.partners", {"app.registry.endpoints"})
    assert violations("app.web.api.partners", {"sqlalchemy.select"})
    assert violations("sender.engine.claim", {"dlq.resend"})
    assert violations("app.services.endpoints", {"flask", "app.web.links"}) == [
        "app.web.links (app.services -> app.web)"
    ]
    assert violations("app.models", {"sender.ordering"})
    assert not violations("app.cli.run", {"app.processes.worker"})
    assert violations("app.cli.admin", {"app.processes.worker"})


@pytest.mark.parametrize(
    "path", sorted((ROOT / "app/services").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_services_import_no_framework(path: Path) -> None:
    frameworks = ("flask", "werkzeug", "click", "jinja2", "gunicorn")
    found = {
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in frameworks)
    }
    assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"
