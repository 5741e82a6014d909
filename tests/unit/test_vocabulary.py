"""The vocabulary is the one home of Kurir's fixed words, and its lists are exactly what the
code writes: the dead-letter reasons an operator can filter by are the reasons `park` is given.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, cast

import pytest

from app import models
from app.vocabulary import (
    DeadLetterReason,
    DeliveryState,
    EndpointMode,
    EndpointState,
    InboundStatus,
    ResendSkip,
    values,
)
from sender.park import park

ROOT = Path(__file__).resolve().parents[2]


def _sources() -> list[tuple[Path, ast.Module]]:
    paths = sorted(p for folder in ("app", "sender", "dlq") for p in (ROOT / folder).rglob("*.py"))
    return [(path, ast.parse(path.read_text(), filename=str(path))) for path in paths]


def _is_park(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "park") or (
        isinstance(func, ast.Attribute) and func.attr == "park"
    )


def _reason_argument(call: ast.Call) -> ast.expr:
    for keyword in call.keywords:
        if keyword.arg == "reason":
            return keyword.value
    return call.args[4]


def _members_named(tree: ast.AST) -> set[str]:
    """`DeadLetterReason.X` written anywhere in a module: the reasons it can hand to park."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "DeadLetterReason"
    }


def test_dead_letter_reasons_are_exactly_the_reasons_park_is_given() -> None:
    """Every park() call names its reason from the enum (or passes one on in a variable that
    mypy holds to the enum, since park takes a DeadLetterReason), and every member of the
    enum is handed to park somewhere: no reason the code can write is missing, and none is
    offered that nothing writes."""
    calls = 0
    written: set[str] = set()
    for path, tree in _sources():
        parks = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _is_park(node)]
        if not parks:
            continue
        for call in parks:
            calls += 1
            reason = _reason_argument(call)
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            assert not isinstance(reason, ast.Constant), f"{where} spells a reason: use the enum"
            assert isinstance(reason, ast.Name | ast.Attribute), where
            if isinstance(reason, ast.Attribute):
                assert isinstance(reason.value, ast.Name), where
                assert reason.value.id == "DeadLetterReason", where
        written |= _members_named(tree)
    assert calls >= 5, "the scan found too few park() calls to mean anything"
    assert written == {member.name for member in DeadLetterReason}


def test_park_refuses_a_reason_outside_the_vocabulary() -> None:
    """Checked before anything is touched, so a stray word never reaches the database."""
    nothing = cast(Any, None)
    with pytest.raises(ValueError, match="blocked_address"):
        park(nothing, nothing, nothing, nothing, cast(Any, "blocked_address"))


def test_no_module_spells_a_reason_or_a_skip_in_a_comparison() -> None:
    """`x == "endpoint_disabled"` would pass review and drift; the enums are compared instead."""
    words = {
        *values(DeadLetterReason),
        *values(ResendSkip),
        *values(EndpointState),
        *values(EndpointMode),
    }
    found = []
    for path, tree in _sources():
        if path.name == "vocabulary.py" or "web/ui" in path.as_posix():
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Constant) and side.value in words:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {side.value!r}")
    assert not found


def test_members_are_their_text() -> None:
    """What makes the enums safe to store: equal to, hashed as and serialised as the text."""
    assert DeliveryState.PENDING == "pending"
    assert {"pending": 1}[DeliveryState.PENDING] == 1
    assert f"{InboundStatus.QUARANTINED}" == str(InboundStatus.QUARANTINED) == "quarantined"
    assert (
        json.dumps({ResendSkip.NOT_OPEN: EndpointState.DISABLED})
        == '{"dead_letter_not_open": "disabled"}'
    )
    assert values(EndpointMode) == ("push", "pull")
    assert all(type(word) is str for word in values(EndpointMode))


def test_the_short_names_of_the_models_are_the_vocabulary() -> None:
    assert models.PENDING is DeliveryState.PENDING
    assert models.DL_STATES == ("open", "resent", "discarded")
    assert values(InboundStatus) == models.INBOUND_STATUSES
    assert values(DeliveryState) == models.DELIVERY_STATES
