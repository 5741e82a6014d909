"""Endpoint filters: a JMESPath expression over an event that must be truthy for an endpoint
to get it, under the same bounds as downgrades.

A filter reads the event's envelope — `{"type", "version", "data", "resource"}`, the version
published — and is judged by JMESPath's own truth: `false`, `null`, `""`, `[]` and `{}` are
false, everything else (numbers included, `0` too) is true. It is checked when it is set
(`check`: the static bounds of `downgrades.compile_checked`, the one bounded compile) and
evaluated in the publish transaction. A filter without loops — fields, indexes, literals,
comparisons, `&&`, `||`, `!`, pipes: each node is evaluated at most once, so its work is its
own length — is compiled to Python closures that follow JMESPath's rules (`straight`); it
runs in a few microseconds, which is what lets a thousand filtered endpoints cost little more
than an unfiltered fan-out. Any other filter (projections, functions) runs in the metered
interpreter of `downgrades.run`, each evaluation within `MAX_WORK` units and `MAX_BYTES` of
built values. A filter that fails on an event (a type error, the data nested too deeply) or
spends its budget does not match: the endpoint gets no delivery of that event.

Compiled filters are cached per process by (endpoint id, filter text): a changed filter is a
new key, so no process — nor a test reusing an endpoint id on a fresh database — can run a
stale one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jmespath.parser import ParsedResult
from jmespath.visitor import TreeInterpreter

from app.event_types import downgrades

# Characters of a filter's text.
MAX_LENGTH = 1000
# Work units one evaluation may spend (nodes evaluated, elements touched): a filter such as
# `data.amount > `1000` && data.currency == 'EUR'` spends about ten.
MAX_WORK = 2_000
# The largest value one evaluation may build (a projection, a multi-select), in JSON bytes.
MAX_BYTES = 64 * 1024
# Compiled filters kept per process; at the bound the cache is emptied.
CACHE_MAX = 10_000

Refused = downgrades.Refused


Straight = Callable[[Any], Any]


@dataclass(frozen=True)
class Filter:
    """A parsed filter, and its closure when it has no loops (None: run it metered)."""

    parsed: ParsedResult
    straight: Straight | None


def _is_actual_number(value: Any) -> bool:
    """JSON numbers (JMESPath's rule, without the slow ABC check: JSON has int and float)."""
    return type(value) in (int, float)


def _is_comparable(value: Any) -> bool:
    return type(value) in (int, float, str)


def _is_false(value: Any) -> bool:
    return value is None or value is False or value in ("", [], {})


def straight(node: dict[str, Any]) -> Straight | None:
    """The expression as nested closures, when every node is evaluated at most once (no
    projection, no function); None otherwise. Same results as JMESPath's interpreter."""
    kind = node.get("type")
    children = node.get("children", [])
    if kind == "field":
        key = node["value"]
        return lambda v: v.get(key) if isinstance(v, dict) else None
    if kind == "index":
        at = node["value"]
        return lambda v: v[at] if isinstance(v, list) and -len(v) <= at < len(v) else None
    if kind == "literal":
        constant = node["value"]
        return lambda v: constant
    if kind in ("current", "identity"):
        return lambda v: v
    if kind == "subexpression" and all(c.get("type") == "field" for c in children):
        path = [c["value"] for c in children]  # a.b.c: one loop, no call per field

        def fields(v: Any) -> Any:
            for key in path:
                if not isinstance(v, dict):
                    return None
                v = v.get(key)
            return v

        return fields
    parts = [straight(child) if isinstance(child, dict) else None for child in children]
    if not parts or any(part is None for part in parts):
        return None
    steps: list[Straight] = [part for part in parts if part is not None]
    if kind in ("subexpression", "index_expression", "pipe"):

        def chain(v: Any) -> Any:
            for step in steps:
                v = step(v)
            return v

        return chain
    if kind == "not_expression" and len(steps) == 1:
        inner = steps[0]

        def negated(v: Any) -> bool:
            x = inner(v)
            return False if _is_actual_number(x) and x == 0 else not x

        return negated
    if len(steps) != 2:
        return None
    left, right = steps
    if kind == "and_expression":
        return lambda v: a if _is_false(a := left(v)) else right(v)
    if kind == "or_expression":
        return lambda v: right(v) if _is_false(a := left(v)) else a
    if kind == "comparator":
        compare = TreeInterpreter.COMPARATOR_FUNC[node["value"]]
        if node["value"] in TreeInterpreter._EQUALITY_OPS:
            return lambda v: compare(left(v), right(v))

        def ordered(v: Any) -> Any:
            a, b = left(v), right(v)
            return compare(a, b) if _is_comparable(a) and _is_comparable(b) else None

        return ordered
    return None


def compiled_filter(parsed: ParsedResult) -> Filter:
    return Filter(parsed, straight(parsed.parsed))


def check(expression: str) -> Filter:
    """A filter's text, compiled under the static bounds shared with downgrades.

    Raises:
        Refused: empty or too long (`bound` `length`), not JMESPath (`syntax`, with the
            parser's message), or past a static bound (`depth`, `pipes`, `functions`,
            `copies`).
    """
    if not expression.strip() or len(expression) > MAX_LENGTH:
        raise Refused(
            f"a filter is a JMESPath expression of 1 to {MAX_LENGTH} characters",
            "length",
            MAX_LENGTH,
        )
    return compiled_filter(downgrades.compile_checked(expression))


def envelope(
    type_: str, version: int, data: Any, resource: dict[str, Any] | None
) -> dict[str, Any]:
    """What a filter reads."""
    return {"type": type_, "version": version, "data": data, "resource": resource}


def truthy(value: Any) -> bool:
    """JMESPath's truth: false, null and empty strings, lists and objects are false."""
    return not (value is None or value is False or value in ("", [], {}))


@dataclass(frozen=True)
class Outcome:
    """One evaluation: whether it matched, and why not when it could not run."""

    matched: bool
    error: str | None = None


def evaluate(compiled: Filter, event: dict[str, Any]) -> Outcome:
    """The filter's verdict on one envelope (metered within its budgets unless it has no
    loops)."""
    try:
        if compiled.straight is not None:
            value = compiled.straight(event)
        else:
            value = downgrades.run(compiled.parsed, event, downgrades.Meter(MAX_BYTES, MAX_WORK))
    except downgrades.TooLarge as exc:
        return Outcome(False, str(exc).replace("the downgrade", "the filter"))
    except downgrades.Failed as exc:
        return Outcome(False, str(exc)[: downgrades.MESSAGE_CHARS])
    except (TypeError, ValueError, RecursionError) as exc:
        # e.g. `<` between a string and a number: JMESPath raises, the filter does not match.
        return Outcome(False, f"the filter cannot be applied: {str(exc)[:120]}")
    return Outcome(truthy(value))


class CompiledFilters:
    """Parsed filters by (endpoint id, filter text), made once per process."""

    def __init__(self, max_size: int = CACHE_MAX) -> None:
        self._items: dict[tuple[str, str], Filter | None] = {}
        self._lock = threading.Lock()
        self._max = max_size
        self.compiled = 0  # how many were parsed (what a test can watch)

    def get(self, endpoint_id: str, expression: str) -> Filter | None:
        """The parsed filter, or None when the stored text no longer parses (it then
        matches nothing)."""
        key = (endpoint_id, expression)
        try:
            return self._items[key]
        except KeyError:
            pass
        try:
            parsed: Filter | None = compiled_filter(downgrades.compile_expression(expression))
        except Refused:
            parsed = None
        with self._lock:
            self.compiled += 1
            if len(self._items) >= self._max:
                self._items.clear()
            self._items[key] = parsed
        return parsed


compiled = CompiledFilters()


def filtered_out(
    filters: dict[str, str], event: dict[str, Any], candidates: list[str] | None = None
) -> set[str]:
    """The endpoints (ids) among `candidates` (default: every key of `filters`) whose filter
    does NOT match `event`; endpoints without a filter always match. One evaluation per
    distinct filter text, however many endpoints share it."""
    verdicts: dict[str, bool] = {}
    refused: set[str] = set()
    for endpoint_id in filters if candidates is None else candidates:
        text = filters.get(endpoint_id)
        if text is None:
            continue
        verdict = verdicts.get(text)
        if verdict is None:
            parsed = compiled.get(endpoint_id, text)
            verdict = parsed is not None and evaluate(parsed, event).matched
            verdicts[text] = verdict
        if not verdict:
            refused.add(endpoint_id)
    return refused
