"""Fuzzed API: every operation of /openapi.json, driven with generated input, never answers 5xx.

Schemathesis reads the app's own document and generates requests for each operation: valid
ones (positive) and ones that break the schema (negative), with an admin key so handlers run,
not only authentication. Half the cases point their path parameters at resources that exist
(a partner, an endpoint, an event, a delivery, a dead letter, a source, an inbound event), so
the handlers behind the lookups get fuzzed bodies and queries too.

The figure: 0 responses >= 500, and every error in the `{"error": {code, message, details}}`
shape. Each run prints how many requests it tried. `FUZZ_EXAMPLES` (default 12 per operation
and mode) scales it: CI runs the default; `FUZZ_EXAMPLES=200 pytest -k fuzz -s` is the long run.
Hand-written nasty cases and the inbound signature flood are in test_fuzz_nasty.py.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.support.fuzz import Tally, known_path_parameters

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))


def test_every_operation_answers_generated_input_without_5xx(
    app: Any, seeded: dict[str, str], auth: dict[str, str], backend: str
) -> None:
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app)
    # The key is ours to give: generated or mutated security headers would only test the 401.
    schema.config.generation.update(with_security_parameters=False)
    tally = Tally()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 35  # the whole document, not a subset
    for operation in operations:
        names = {p.name for p in operation.path_parameters}
        known = {
            k: v for k, v in known_path_parameters(operation.path, seeded).items() if k in names
        }
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies = [operation.as_strategy(generation_mode=mode)]
            if known:
                strategies.append(
                    operation.as_strategy(generation_mode=mode, path_parameters=known)
                )
            label = f"{operation.method.upper()} {operation.path} [{mode.value}]"
            try:
                _drive(st.one_of(strategies), auth, tally, label)
            except Unsatisfiable:
                # Nothing in the operation can be made invalid (e.g. no parameters, no body).
                assert mode is GenerationMode.NEGATIVE, label
                tally.ungenerable.append(label)
    print(
        f"\nfuzzed API ({backend}): {tally.requests} requests over {len(operations)} "
        f"operations, {EXAMPLES} examples per operation and mode; statuses "
        f"{dict(sorted(tally.by_status.items()))}; {tally.problem_count} broke the rules; "
        f"no invalid input possible for {tally.ungenerable}"
    )
    assert tally.problems == []


def _drive(
    strategy: st.SearchStrategy[Any], auth: dict[str, str], tally: Tally, label: str
) -> None:
    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        headers = dict(case.headers or {})
        headers["Authorization"] = auth["Authorization"]
        response = case.call(headers=headers)
        tally.check(
            f"{label} {case.as_curl_command()[:300]}",
            response.status_code,
            response.headers.get("content-type", [None])[0]
            if isinstance(response.headers.get("content-type"), list)
            else response.headers.get("content-type"),
            response.content,
        )

    run()
