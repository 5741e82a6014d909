"""The recorder's writes on PostgreSQL: a whole batch as one statement, whatever its size.

A batch of attempts or of fenced state changes is a list of rows. Sent as an executemany,
each row is its own statement on the wire and its own trip through SQLAlchemy and psycopg's
pipeline, which at a trickle (batches of one or two) costs more CPU than the transaction
around it, and in a backlog (batches of hundreds) costs per row what one statement could do
once. Here the rows travel as one JSON array parameter, unpacked by `json_to_recordset`: one
statement per batch, whose text never changes, so psycopg prepares it and PostgreSQL plans it
once per connection.

The fence is the same as the executemany's (`state = 'delivering'` and the lease the
delivery was claimed with), and a row's values are exactly those the per-row statements bound.
SQLite has neither arrays nor `json_to_recordset`: the recorder keeps its per-row statements
there.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from app.db import Database
from app.db_direct import Held
from app.models import DELIVERING, PENDING, RETRYING, SUCCEEDED

# A batch's attempts as rows of one JSON document; the two statements below differ only in
# what a row already recorded (the same delivery and attempt number) does.
_INSERT_ATTEMPTS = (
    "INSERT INTO attempts (id, delivery_id, n, started_at, duration_ms, url, "
    "request_headers, response_status, response_body, response_headers, error, "
    "created_at) SELECT r.id, r.delivery_id, r.n, r.started_at, r.duration_ms, "
    "r.url, r.request_headers, r.response_status, decode(r.response_body, "
    "'base64'), r.response_headers, r.error, r.created_at FROM "
    "json_to_recordset(CAST(:rows AS json)) AS r(id text, delivery_id text, n int, "
    "started_at timestamptz, duration_ms int, url text, request_headers json, "
    "response_status int, response_body text, response_headers json, error text, "
    "created_at timestamptz) ON CONFLICT (delivery_id, n) "
)
# Written out whole: the fence on every update is the executemany's (`sender.engine.recorder`).
_STATEMENTS = {
    "attempts": text(
        _INSERT_ATTEMPTS + "DO UPDATE SET started_at "
        "= excluded.started_at, duration_ms = excluded.duration_ms, url = excluded.url, "
        "request_headers = excluded.request_headers, response_headers = "
        "excluded.response_headers, response_status = excluded.response_status, "
        "response_body = excluded.response_body, error = excluded.error"
    ),
    "attempts_keep": text(_INSERT_ATTEMPTS + "DO NOTHING"),
    "succeeded": text(
        "UPDATE deliveries AS d SET state = :succeeded, attempt_count = v.b_n, "
        "run_attempts = v.b_run_n, last_status_code = v.b_status, last_error = NULL, "
        "succeeded_at = v.b_at, next_attempt_at = NULL, lease_expires_at = NULL, "
        "updated_at = v.b_now FROM json_to_recordset(CAST(:rows AS json)) AS v(b_id "
        "text, b_lease timestamptz, b_n int, b_run_n int, b_status int, b_at "
        "timestamptz, b_now timestamptz) WHERE d.id = v.b_id AND d.state = :delivering "
        "AND d.lease_expires_at = v.b_lease"
    ),
    "retrying": text(
        "UPDATE deliveries AS d SET state = :retrying, attempt_count = v.b_n, "
        "run_attempts = v.b_run_n, last_status_code = v.b_status, last_error = "
        "v.b_error, next_attempt_at = v.b_next, lease_expires_at = v.b_hold, updated_at "
        "= v.b_now FROM json_to_recordset(CAST(:rows AS json)) AS v(b_id text, b_lease "
        "timestamptz, b_n int, b_run_n int, b_status int, b_error text, b_next "
        "timestamptz, b_hold timestamptz, b_now timestamptz) WHERE d.id = v.b_id AND "
        "d.state = :delivering AND d.lease_expires_at = v.b_lease"
    ),
    "release": text(
        "UPDATE deliveries AS d SET state = CASE WHEN d.run_attempts > 0 THEN :retrying "
        "ELSE :pending END, lease_expires_at = v.b_hold FROM "
        "json_to_recordset(CAST(:rows AS json)) AS v(b_id text, b_lease timestamptz, "
        "b_hold timestamptz) WHERE d.id = v.b_id AND d.state = :delivering AND "
        "d.lease_expires_at = v.b_lease"
    ),
}
# Attempts and successes together: data-modifying CTEs are one atomic statement, so on a
# connection in autocommit this is the whole transaction in one round trip.
_SUCCESSES = text(
    "WITH written AS ("
    + str(_STATEMENTS["attempts"]).replace(":rows", ":attempts")
    + ") "
    + str(_STATEMENTS["succeeded"]).replace(":rows", ":succeeded_rows")
)

_STATES = {
    "delivering": DELIVERING,
    "succeeded": SUCCEEDED,
    "retrying": RETRYING,
    "pending": PENDING,
}
_USES = {
    "attempts": (),
    "attempts_keep": (),
    "succeeded": ("delivering", "succeeded"),
    "retrying": ("delivering", "retrying"),
    "release": ("delivering", "retrying", "pending"),
}


def _encode(value: Any) -> Any:
    """JSON for what a row holds besides str, int and None: instants and response bodies."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot send {type(value).__name__} in a row set")


def _json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, default=_encode, separators=(",", ":"))


def _unique_attempts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (delivery, n), the last winning as it would row by row: one INSERT ... ON
    CONFLICT DO UPDATE may not touch the same row twice."""
    return list({(r["delivery_id"], r["n"]): r for r in rows}.values())


def write_successes(
    db: Database,
    attempts: list[dict[str, Any]],
    succeeded: list[dict[str, Any]],
    held: Held | None = None,
) -> None:
    """A batch of successes as one statement: `write("attempts")` and `write("succeeded")`
    at once, run on the driver in autocommit (`Database.direct`): atomic, a single round
    trip, and none of SQLAlchemy's per-execution work (at a trickle, a flush per delivery
    or two); on `held`'s connection when given (the writer thread's)."""
    db.direct(_SUCCESSES).run(
        {
            "attempts": _json(_unique_attempts(attempts)),
            "succeeded_rows": _json(succeeded),
            "delivering": DELIVERING,
            "succeeded": SUCCEEDED,
        },
        held,
    )


def write(connection: Connection, kind: str, rows: list[dict[str, Any]]) -> None:
    """Write `rows` with the statement `kind` (`attempts`, `attempts_keep`, `succeeded`,
    `retrying` or `release`): the same rows the per-row statements take, in one statement.

    Attempts are deduplicated on (delivery, n) (`_unique_attempts`).
    """
    if kind.startswith("attempts"):
        rows = _unique_attempts(rows)
    params: dict[str, Any] = {name: _STATES[name] for name in _USES[kind]}
    params["rows"] = _json(rows)
    connection.execute(_STATEMENTS[kind], params)
