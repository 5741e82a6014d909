"""Strict JSON: refuse what ``json.loads`` lets through but the stores and partners cannot take.

Python's parser accepts, beyond RFC 8259:

- ``NaN``, ``Infinity``, ``-Infinity`` and literals such as ``1e400`` that overflow to
  infinity: we would store them and sign bodies for partners that are not JSON;
- lone UTF-16 surrogates, from a ``\\uD800``-``\\uDFFF`` escape without its pair, or from
  raw surrogate bytes (``json.loads(bytes)`` decodes with ``surrogatepass``): such a string
  has no UTF-8 form, so PostgreSQL, SQLite and ``str.encode`` refuse it at write time;
- input that fails with something other than ``JSONDecodeError``: integers beyond Python's
  digit limit, nesting beyond the recursion limit.

:func:`loads` refuses all of them with :class:`InvalidJSON`. It sits on the publish hot path,
so the common body costs a strict decode, the C parser and one C-level scan of the text; only
a body that contains a surrogate escape has its strings checked one by one. No Flask here:
``app.web`` and ``app.inbound`` both parse through this module.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from typing import Any, NoReturn

__all__ = ["InvalidJSON", "has_lone_surrogate", "loads", "nul_at"]

# A \u escape in the surrogate block; an escaped backslash before it ("\\ud800") is a false
# alarm, settled by the exact check that follows.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# JSON text cannot carry a raw NUL in a string, only this escape (its hex digits are all 0).
_NUL_ESCAPE = b"\\u0000"
_MAX_SHOWN = 40


class InvalidJSON(ValueError):
    """A body that is not JSON Kurir can store and pass on; the message says why."""


def loads(data: bytes) -> Any:
    """Parse a JSON document, refusing what could not be stored or sent on as JSON.

    Raises:
        InvalidJSON: not UTF-8/16/32 text, not JSON, a non-finite number, an integer
            too long to convert, nesting too deep, or a lone surrogate in a string or key.
    """
    try:
        # Strict decoding: raw surrogate bytes are refused here, so only escapes remain.
        text = data.decode(json.detect_encoding(data))
    except UnicodeDecodeError as exc:
        raise InvalidJSON(str(exc)) from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise InvalidJSON("nested too deeply") from None
    except InvalidJSON:
        raise
    except json.JSONDecodeError as exc:
        raise InvalidJSON(str(exc)) from None
    except ValueError:  # int()'s digit limit (sys.get_int_max_str_digits)
        raise InvalidJSON("an integer has too many digits") from None
    if _SURROGATE_ESCAPE.search(text) is not None:
        where = _lone_surrogate_at(document)
        if where is not None:
            raise InvalidJSON(
                f"{where} contains a lone UTF-16 surrogate (a \\uD800-\\uDFFF "
                "escape without its pair); it has no UTF-8 encoding"
            )
    return document


def nul_at(raw: bytes, document: Any, *, skip: Collection[str] = ()) -> str | None:
    """Where a NUL character is in a parsed document, as a JSON pointer (None: nowhere).

    PostgreSQL refuses NUL in ``text`` columns, so a name or description holding one cannot
    be stored. `skip` names top-level members kept only as JSON (where NUL stays escaped),
    which may hold it. `raw` is the text `document` was parsed from: without the escape in
    it (the common case, one C-level search) there is nothing to walk.
    """
    if _NUL_ESCAPE not in raw and json.detect_encoding(raw).startswith("utf-8"):
        return None  # JSON's \u escape is lower case only; UTF-16/32 text is walked
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        pointer, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return _describe(pointer, "the string at")
        elif isinstance(value, dict):
            for key, item in value.items():
                if "\x00" in key:
                    return _describe(pointer, "a key of the object at")
                if pointer == "" and key in skip:
                    continue
                stack.append((f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}", item))
        elif isinstance(value, list):
            stack.extend((f"{pointer}/{index}", item) for index, item in enumerate(value))
    return None


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a code point that cannot be encoded (and so cannot be stored)."""
    return _LONE_SURROGATE.search(text) is not None


def _refuse_constant(name: str) -> NoReturn:
    raise InvalidJSON(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # a JSON literal cannot spell NaN, only overflow to infinity
        raise InvalidJSON(f"number {literal[:_MAX_SHOWN]} is out of range")
    return value


def _lone_surrogate_at(document: Any) -> str | None:
    """Where a lone surrogate is, as a JSON pointer (iterative: depth is unbounded).

    A bad key is reported as the object holding it, so the answer itself stays encodable.
    """
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        pointer, value = stack.pop()
        if isinstance(value, str):
            if has_lone_surrogate(value):
                return _describe(pointer, "the string at")
        elif isinstance(value, dict):
            for key, item in value.items():
                if has_lone_surrogate(key):
                    return _describe(pointer, "a key of the object at")
                stack.append((f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}", item))
        elif isinstance(value, list):
            stack.extend((f"{pointer}/{index}", item) for index, item in enumerate(value))
    return None


def _describe(pointer: str, what: str) -> str:
    shown = pointer if len(pointer) <= 2 * _MAX_SHOWN else pointer[: 2 * _MAX_SHOWN] + "..."
    return f"{what} {shown!r}" if pointer else f"{what} the root"
