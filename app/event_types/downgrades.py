"""Downgrade expressions under fixed bounds, so a registered JMESPath can never blow up.

A downgrade is a JMESPath expression a publisher registers and Kurir runs in the API process on
every publish to an endpoint pinned below the version published. JMESPath can build a small
value that *serialises* huge (`{a: @, b: @} | {a: @, b: @} | ...` shares one object at every
stage: 30 stages cost nothing to build and 2^30 nodes to write out), and its functions
materialise (`to_string`, `join`, `[]`), so neither the expression's length nor the size of
its input bounds the work. Three layers bound it:

1. `compile_checked` (registration): the expression parses without exhausting the stack, nests
   at most `MAX_DEPTH` levels, has at most `MAX_PIPES` pipes, names only known functions, and
   copies any part of its input at most `MAX_COPIES` times — counted statically: a
   multi-select of overlapping parts (`{a: @, b: @}`) copies twice, stages multiply, disjoint
   fields (`{a: x, b: y}`) copy once.
2. `run` (registration, on the examples, and every publish): a metered interpreter. Every
   node it evaluates and every element it touches costs one unit of `max_work`; every value
   it builds is sized as it is built (shared parts counted each time they appear, as JSON
   would write them) and may not exceed `max_bytes`; `to_string`, `join` and equality are
   sized or charged *before* they run. It stops at the first excess (`TooLarge`), so the
   worst case is the budget, not the expression.
3. `encoded_size`: the result's exact JSON length, taken only once the metered run has shown
   the value is within a small factor of the limit (the caller compares it to the limit).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import jmespath
from jmespath import functions as jp_functions
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult
from jmespath.visitor import Options, TreeInterpreter

# Nesting of the parsed expression: keeps the interpreter's recursion shallow (registration
# also refuses what the parser itself cannot nest, `((((...@))))`).
MAX_DEPTH = 32
# Pipes (`|`) in one expression: each feeds a whole value to the next stage.
MAX_PIPES = 16
# How many times one part of the input may appear in the output (a static bound).
MAX_COPIES = 4
# Work units (nodes evaluated, elements touched, characters sized) that the downgrades made for
# one event may spend together, and those of one registration's examples: about half a
# million a second on a slow core (docs/security.md has the measured figures).
MAX_WORK = 500_000
# Downgrades applied one after another for one event (N -> N-1 -> ...): each link costs a run,
# a validation and a serialisation, so a pin may lie at most this far below the version it is
# made from (a rendition starts a new chain).
MAX_HOPS = 10
MESSAGE_CHARS = 200
FUNCTIONS = frozenset(jp_functions.Functions.FUNCTION_TABLE)
# Wildcard path segments of the static copy count: any list element, any object member.
_ANY_ITEM, _ANY_MEMBER = "[]", "*"


class Refused(ValueError):
    """The expression is not JMESPath, or lies outside the static bounds: `bound` names which
    (`syntax`, `depth`, `pipes`, `functions`, `copies`), `limit` its value."""

    def __init__(self, message: str, bound: str = "syntax", limit: int | None = None) -> None:
        super().__init__(message)
        self.bound = bound
        self.limit = limit


class TooLarge(Exception):
    """Running the expression went past a budget: `reason` is `bytes` or `work`."""

    def __init__(self, reason: str, limit: int) -> None:
        what = "a value larger than" if reason == "bytes" else "more work than"
        unit = "bytes" if reason == "bytes" else "units"
        super().__init__(f"the downgrade builds {what} {limit} {unit}")
        self.reason = reason
        self.limit = limit


class Failed(Exception):
    """The expression cannot be applied to this data (a type error, or nested too deeply)."""


# ---------------------------------------------------------------------------- compiling


def compile_expression(expression: str) -> ParsedResult:
    """Parse only (what was stored before the static bounds existed still runs, metered).

    Raises:
        Refused: not JMESPath, or nested past what the parser can take.
    """
    try:
        return jmespath.compile(expression)
    except JMESPathError as exc:
        # The parser's message repeats the whole expression under a caret line: its first
        # line, shortened, says enough.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Refused(f"not a valid JMESPath expression: {first[:MESSAGE_CHARS]}") from None
    except RecursionError:
        raise Refused(
            f"nested too deeply (at most {MAX_DEPTH} levels)", "depth", MAX_DEPTH
        ) from None


def compile_checked(expression: str) -> ParsedResult:
    """Parse and check the static bounds (depth, pipes, functions, copies).

    Raises:
        Refused: with a message saying which bound, and the limit.
    """
    parsed = compile_expression(expression)
    depth, pipes, called = _shape(parsed.parsed)
    if depth > MAX_DEPTH:
        raise Refused(f"nests {depth} levels deep; at most {MAX_DEPTH}", "depth", MAX_DEPTH)
    if pipes > MAX_PIPES:
        raise Refused(f"has {pipes} pipes; at most {MAX_PIPES}", "pipes", MAX_PIPES)
    unknown = sorted(called - FUNCTIONS)
    if unknown:
        raise Refused(
            f"calls unknown function(s): {', '.join(f'{n}()' for n in unknown)}", "functions"
        )
    copies = _most_copies(_footprint(parsed.parsed)[0])
    if copies > MAX_COPIES:
        raise Refused(
            f"can copy one part of its input {copies} times; at most {MAX_COPIES} "
            "(a multi-select of the same part, like {a: @, b: @}, copies it twice, "
            "and each stage multiplies)",
            "copies",
            MAX_COPIES,
        )
    return parsed


def _children(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    # A slice's children are its numbers, not nodes.
    return (child for child in node.get("children", ()) if isinstance(child, dict))


def _shape(root: dict[str, Any]) -> tuple[int, int, set[str]]:
    """(nesting depth, pipes, function names), walked without recursion."""
    depth, pipes, called = 0, 0, set()
    stack = [(root, 1)]
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        kind = node.get("type")
        if kind == "pipe":
            pipes += 1
        elif kind == "function_expression":
            called.add(str(node.get("value")))
        stack.extend((child, level + 1) for child in _children(node))
    return depth, pipes, called


# A footprint: which parts of the input (paths from the current value) an expression's output
# contains, and how many times each. `pure` is the path when the output IS that part.
Footprint = list[tuple[tuple[str, ...], int]]
_SCALAR_FUNCTIONS = frozenset(
    {
        "abs",
        "avg",
        "ceil",
        "contains",
        "ends_with",
        "floor",
        "length",
        "starts_with",
        "sum",
        "to_number",
        "type",
    }
)
_KEY_FUNCTIONS = frozenset({"sort_by", "min_by", "max_by"})  # the expref only ranks


def _footprint(node: dict[str, Any]) -> tuple[Footprint, tuple[str, ...] | None]:
    """Static copy count of one expression node (recursion bounded by `MAX_DEPTH`)."""
    kind = node.get("type")
    children = list(_children(node))
    if kind in ("current", "identity"):
        return [((), 1)], ()
    if kind == "field":
        return [((str(node["value"]),), 1)], (str(node["value"]),)
    if kind == "index":
        return [((_ANY_ITEM,), 1)], (_ANY_ITEM,)
    if kind == "slice":
        return [((), 1)], None
    if kind in ("literal", "comparator", "not_expression"):
        return [], None
    if kind in ("subexpression", "index_expression", "pipe"):
        footprint, pure = _footprint(children[0])
        for child in children[1:]:
            footprint, pure = _then(footprint, pure, _footprint(child))
        return footprint, pure
    if kind in ("projection", "filter_projection", "value_projection"):
        left, pure = _footprint(children[0])
        item = _ANY_MEMBER if kind == "value_projection" else _ANY_ITEM
        each = _footprint(children[1])
        return _then(left, None if pure is None else (*pure, item), each)[0], None
    if kind == "flatten":
        return _footprint(children[0])[0], None
    if kind == "function_expression":
        name = node.get("value")
        if name in _SCALAR_FUNCTIONS:
            return [], None
        if name == "map" and len(children) == 2:
            left, pure = _footprint(children[1])
            each = _footprint(children[0]["children"][0])
            return _then(left, None if pure is None else (*pure, _ANY_ITEM), each)[0], None
        args = children[:1] if name in _KEY_FUNCTIONS else children
        return [entry for arg in args for entry in _footprint(arg)[0]], None
    if kind == "expref":
        return _footprint(children[0])[0], None
    # multi-selects, key/value pairs, `||`, `&&`: everything their parts output.
    return [entry for child in children for entry in _footprint(child)[0]], None


def _then(
    footprint: Footprint,
    pure: tuple[str, ...] | None,
    after: tuple[Footprint, tuple[str, ...] | None],
) -> tuple[Footprint, tuple[str, ...] | None]:
    """`after` applied to the output of an expression with `footprint`."""
    next_footprint, next_pure = after
    if pure is not None:
        # The output is that part of the input: the next stage reads below it.
        return (
            [((*pure, *path), count) for path, count in next_footprint],
            None if next_pure is None else (*pure, *next_pure),
        )
    factor = _most_copies(next_footprint)
    return [(path, count * factor) for path, count in footprint], None


def _overlap(shorter: tuple[str, ...], longer: tuple[str, ...]) -> bool:
    """Whether some node lies under both paths (wildcards match any segment)."""
    return len(shorter) <= len(longer) and all(
        a == b or _ANY_ITEM in (a, b) or _ANY_MEMBER in (a, b)
        for a, b in zip(shorter, longer, strict=False)
    )


def _most_copies(footprint: Footprint) -> int:
    """The most copies of any one input node: the copies of a node are the counts of every
    path above or at it (paths grouped by their first segment, so wide multi-selects of
    distinct fields stay cheap to check)."""
    merged: dict[tuple[str, ...], int] = {}
    for path, count in footprint:
        merged[path] = merged.get(path, 0) + count
    by_head: dict[str | None, list[tuple[tuple[str, ...], int]]] = {}
    for path, count in merged.items():
        by_head.setdefault(path[0] if path else None, []).append((path, count))
    wild = {None, _ANY_ITEM, _ANY_MEMBER}
    best = 0
    for deepest in merged:
        heads: set[str | None] = (
            set(by_head)
            if deepest and deepest[0] in wild
            else (wild | {deepest[0] if deepest else None})
        )
        best = max(
            best,
            sum(
                count
                for head in heads
                for path, count in by_head.get(head, ())
                if _overlap(path, deepest)
            ),
        )
    return best


# ---------------------------------------------------------------------------- running


def _scalar_size(value: Any) -> int:
    """A lower bound of the JSON length of a scalar (escapes and digits are not counted)."""
    kind = type(value)
    if kind is str:
        return len(value) + 2
    if kind is int:
        return max(1, value.bit_length() * 3 // 10)
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, str):
        return len(value) + 2
    return 3  # a float is at least "1.0"


class Meter:
    """Work spent, and a lower bound of the JSON length of every container seen.

    Sizes are memoised by object (each object is kept alive here, so its id stays its own):
    a value shared at many places is sized once and counted at each place, as JSON writes it.
    """

    def __init__(self, max_bytes: int, max_work: int = MAX_WORK) -> None:
        self.max_bytes = max_bytes
        self.max_work = max_work
        self.work = 0
        self._sizes: dict[int, tuple[Any, int]] = {}

    def spend(self, units: int) -> None:
        self.work += units
        if self.work > self.max_work:
            raise TooLarge("work", self.max_work)

    def size(self, value: Any) -> int:
        """The value's JSON length (a lower bound), raising past `max_bytes`."""
        if not isinstance(value, dict | list):
            return self.within(_scalar_size(value))
        sizes = self._sizes
        known = sizes.get(id(value))
        if known is not None:
            return known[1]
        stack = [value]
        while stack:
            node = stack[-1]
            if id(node) in sizes:  # reached twice through a shared part
                stack.pop()
                continue
            total = 1 + max(len(node), 1)  # brackets and commas
            complete = True
            for part in node.values() if isinstance(node, dict) else node:
                if isinstance(part, dict | list):
                    seen = sizes.get(id(part))
                    if seen is None:
                        stack.append(part)
                        complete = False
                    else:
                        total += seen[1]
                else:
                    total += _scalar_size(part)
            if not complete:
                continue  # back here once the parts are sized
            stack.pop()
            if isinstance(node, dict):
                total += sum(map(len, node)) + 3 * len(node)
            self.spend(len(node) + 1)
            sizes[id(node)] = (node, self.within(total))
        return sizes[id(value)][1]

    def built(self, value: Any) -> Any:
        """A value the expression just made: sized now, so no later step can expand it."""
        self.size(value)
        return value

    def within(self, size: int) -> int:
        """`size`, or TooLarge when it is past `max_bytes`."""
        if size > self.max_bytes:
            raise TooLarge("bytes", self.max_bytes)
        return size


class _MeteredFunctions(jp_functions.Functions):
    """JMESPath's functions, each charged (and the materialising ones sized) before it runs."""

    def __init__(self, meter: Meter) -> None:
        super().__init__()
        self.meter = meter

    def call_function(self, function_name: str, resolved_args: list[Any]) -> Any:
        meter = self.meter
        for arg in resolved_args:
            if isinstance(arg, list | dict | str):
                meter.spend(len(arg) + 1)  # type checks and one pass over it
        if function_name == "to_string" and resolved_args and not isinstance(resolved_args[0], str):
            meter.spend(meter.size(resolved_args[0]))  # the string is at least that long
        elif (
            function_name == "join"
            and len(resolved_args) == 2
            and isinstance(resolved_args[1], list)
            and isinstance(resolved_args[0], str)
        ):
            separator, parts = resolved_args
            meter.spend(
                meter.within(
                    sum(len(p) for p in parts if isinstance(p, str))
                    + len(separator) * max(len(parts) - 1, 0)
                )
            )
        elif function_name == "contains" and resolved_args and isinstance(resolved_args[0], list):
            meter.spend(meter.size(resolved_args[0]))  # deep equality with each element
        elif (
            function_name in ("sort", "sort_by", "max", "min", "max_by", "min_by")
            and resolved_args
            and isinstance(resolved_args[0], list)
        ):
            count = len(resolved_args[0])
            meter.spend(count * max(1, math.ceil(math.log2(count + 1))))
        result = super().call_function(function_name, resolved_args)
        if isinstance(result, dict | list | str) and not any(
            result is arg for arg in resolved_args
        ):
            meter.built(result)
        return result


class _MeteredInterpreter(TreeInterpreter):
    """JMESPath's tree interpreter, charging each node and sizing each value it builds."""

    def __init__(self, meter: Meter) -> None:
        super().__init__(Options(custom_functions=_MeteredFunctions(meter)))
        self.meter = meter

    def visit(self, node: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        # The hottest path of a downgrade: the charge and the dispatch, inlined.
        meter = self.meter
        meter.work += 1
        if meter.work > meter.max_work:
            raise TooLarge("work", meter.max_work)
        kind = node["type"]
        method = self._method_cache.get(kind)
        if method is None:
            method = getattr(self, f"visit_{kind}", self.default_visit)
            self._method_cache[kind] = method
        return method(node, *args, **kwargs)

    def visit_comparator(self, node: dict[str, Any], value: Any) -> Any:
        if node["value"] in self._EQUALITY_OPS:
            left = self.visit(node["children"][0], value)
            right = self.visit(node["children"][1], value)
            if left is not right:  # deep equality walks the smaller side at most
                self.meter.spend(min(self.meter.size(left), self.meter.size(right)))
            return self.COMPARATOR_FUNC[node["value"]](left, right)
        return super().visit_comparator(node, value)

    def visit_multi_select_dict(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_multi_select_dict(node, value))

    def visit_multi_select_list(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_multi_select_list(node, value))

    def visit_projection(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_projection(node, value))

    def visit_value_projection(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_value_projection(node, value))

    def visit_filter_projection(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_filter_projection(node, value))

    def visit_flatten(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_flatten(node, value))

    def visit_slice(self, node: dict[str, Any], value: Any) -> Any:
        return self.meter.built(super().visit_slice(node, value))


def run(parsed: ParsedResult, data: Any, meter: Meter) -> Any:
    """The expression's result on `data`, within the meter's budgets.

    Raises:
        TooLarge: a value built, or the work, went past its budget.
        Failed: the expression does not apply to this data (e.g. `abs` of a string).
    """
    try:
        return meter.built(_MeteredInterpreter(meter).visit(parsed.parsed, data))
    except JMESPathError as exc:
        raise Failed(str(exc).strip()) from None
    except RecursionError:
        raise Failed("the data is nested too deeply for this expression") from None


def encoded_size(value: Any) -> int:
    """Bytes of the value as Kurir writes it (compact UTF-8 JSON); call it on a value `run`
    has sized, so the encoding itself is bounded.

    Raises:
        Failed: the value is nested too deeply to encode.
    """
    try:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    except RecursionError:
        raise Failed("the result is nested too deeply to encode") from None
