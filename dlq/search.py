"""Finding dead letters: one filter object shared by the API, the UI, the CLI and bulk resends.

Every filter maps onto an indexed column of `dead_letters` (the table is denormalised for
this). `q` looks for words in the payload: on PostgreSQL `search_text ILIKE '%word%'`, which
the trigram GIN index `ix_dead_letters_search_trgm` answers without scanning the table; on
SQLite a plain `LIKE` (the embedded store is for laptops, not for 100,000 letters).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.base import ExecutableOption

from app.clock import isoformat, parse_time
from app.errors import BadRequest
from app.models import DL_STATES, DeadLetter, Partner
from app.pagination import paginate
from sender.bodies import delivered_versions

# `status_code=none` finds letters whose last attempt got no HTTP answer at all.
NO_STATUS = 0
MAX_Q_WORDS = 10
MAX_WORD_LENGTH = 200
FILTER_KEYS = (
    "partner",
    "endpoint",
    "type",
    "status_code",
    "error",
    "reason",
    "since",
    "until",
    "state",
    "q",
)


def search_text_for(payload: str) -> str:
    """What `q` searches: the exact JSON body partners receive (ids, type, partner, data)."""
    return payload


def _clean(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


@dataclass(frozen=True)
class DeadLetterFilter:
    """The dead-letter search criteria; every field is optional and they combine with AND."""

    partner: str | None = None  # partner uid
    endpoint: str | None = None  # endpoint id
    type: str | None = None  # event type name
    status_code: int | None = None  # last HTTP status; NO_STATUS = none received
    error: str | None = None  # substring of the last error, case-insensitive
    reason: str | None = None
    since: datetime | None = None  # created_at >= since
    until: datetime | None = None  # created_at < until
    state: str | None = None
    q: str | None = None  # words that must all appear in the payload

    @classmethod
    def parse(
        cls, params: Mapping[str, Any], *, strict: bool = False
    ) -> tuple[DeadLetterFilter, dict[str, str]]:
        """Every criterion that parses, and a message for each one that does not.

        A form shows each message on its field and keeps the rest; nothing may act on the
        filter while a message is left, since acting on the valid part alone would widen it.
        `strict` (JSON bodies) also refuses unknown keys, where a typo in a name would widen
        a resend as silently. A blank value is a criterion not given, as in a form.
        """
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for key in ("partner", "endpoint", "type", "error", "reason", "q"):
            values[key] = _clean(params.get(key))
        raw_status = _clean(params.get("status_code"))
        if raw_status is not None:
            if raw_status.lower() in {"none", "null", "0"}:
                values["status_code"] = NO_STATUS
            else:
                try:
                    code = int(raw_status)
                except ValueError:
                    code = None
                    errors["status_code"] = "must be an HTTP status or 'none'"
                if code is not None and not 100 <= code <= 599:
                    errors["status_code"] = "must be between 100 and 599 (or 'none')"
                elif code is not None:
                    values["status_code"] = code
        for key in ("since", "until"):
            raw = params.get(key)
            if isinstance(raw, datetime):
                values[key] = raw
                continue
            text = _clean(raw)
            if text is not None:
                try:
                    values[key] = parse_time(text)
                except ValueError:
                    errors[key] = "must be an RFC 3339 time, e.g. 2026-01-31T12:00:00Z"
        state = _clean(params.get("state"))
        if state is not None:
            state = state.lower()
            if state not in DL_STATES:
                errors["state"] = f"must be one of {', '.join(DL_STATES)}"
            else:
                values["state"] = state
        if values.get("q") is not None:
            words = query_words(values["q"])
            if len(words) > MAX_Q_WORDS:
                errors["q"] = f"at most {MAX_Q_WORDS} words"
            elif any(len(w) > MAX_WORD_LENGTH for w in words):
                errors["q"] = f"words are at most {MAX_WORD_LENGTH} characters"
            if "q" in errors:
                values["q"] = None
        unknown = sorted(set(params) - set(FILTER_KEYS))
        if strict and unknown:
            errors[unknown[0]] = "unknown filter; known: " + ", ".join(FILTER_KEYS)
        for key in errors:
            values.pop(key, None)
        return cls(**values), errors

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, strict: bool = False) -> DeadLetterFilter:
        """Build a filter from query parameters or a JSON object, rejecting what is malformed.

        Raises:
            BadRequest: `invalid_parameter`, naming the first parameter that is wrong (all of
                them in `details.errors`).
        """
        flt, errors = cls.parse(params, strict=strict)
        if errors:
            name = next(iter(errors))
            raise BadRequest(
                f"{name}: {errors[name]}",
                code="invalid_parameter",
                details={"parameter": name, "errors": errors},
            )
        return flt

    def to_params(self) -> dict[str, str]:
        """The filter as strings; `from_params(to_params())` gives the same filter back."""
        out: dict[str, str] = {}
        for key, value in asdict(self).items():
            if value is None:
                continue
            if isinstance(value, datetime):
                out[key] = isoformat(value) or ""
            elif key == "status_code" and value == NO_STATUS:
                out[key] = "none"
            else:
                out[key] = str(value)
        return out

    def with_state(self, state: str | None) -> DeadLetterFilter:
        return replace(self, state=state)

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))


def query_words(q: str) -> list[str]:
    """Split `q` into words; "quoted phrases" stay together."""
    try:
        parts = shlex.split(q)
    except ValueError:  # an unbalanced quote: take the words as they are
        parts = q.replace('"', " ").split()
    return [p for p in (part.strip() for part in parts) if p]


def _like_pattern(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def conditions(flt: DeadLetterFilter) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a filter; each one is served by an index of `dead_letters`."""
    where: list[ColumnElement[bool]] = []
    if flt.partner is not None:
        partner_id = select(Partner.id).where(Partner.uid == flt.partner).scalar_subquery()
        where.append(DeadLetter.partner_id == partner_id)
    if flt.endpoint is not None:
        where.append(DeadLetter.endpoint_id == flt.endpoint)
    if flt.type is not None:
        where.append(DeadLetter.event_type == flt.type)
    if flt.reason is not None:
        where.append(DeadLetter.reason == flt.reason)
    if flt.status_code is not None:
        if flt.status_code == NO_STATUS:
            where.append(DeadLetter.last_status_code.is_(None))
        else:
            where.append(DeadLetter.last_status_code == flt.status_code)
    if flt.error is not None:
        where.append(DeadLetter.last_error.ilike(_like_pattern(flt.error), escape="\\"))
    if flt.since is not None:
        where.append(DeadLetter.created_at >= flt.since)
    if flt.until is not None:
        where.append(DeadLetter.created_at < flt.until)
    if flt.state is not None:
        where.append(DeadLetter.state == flt.state)
    if flt.q is not None:
        for word in query_words(flt.q):
            where.append(DeadLetter.search_text.ilike(_like_pattern(word), escape="\\"))
    return where


def statement(flt: DeadLetterFilter) -> Select[Any]:
    stmt = select(DeadLetter)
    where = conditions(flt)
    return stmt.where(and_(*where)) if where else stmt


@dataclass
class SearchPage:
    """One page of results plus what is needed to render them without more queries per row."""

    letters: list[DeadLetter]
    next_cursor: str | None
    partner_uids: dict[str, str]
    # Delivery id -> the contract version it carries (its pin, or the version published):
    # what a list names next to the type, since a pinned endpoint got another version.
    versions: dict[str, int] = field(default_factory=dict)


def search(
    session: Session,
    flt: DeadLetterFilter,
    *,
    limit: int,
    cursor: str | None = None,
    options: Sequence[ExecutableOption] = (),
) -> SearchPage:
    """One page of matching letters, newest first, keyed on the (time-sortable) id.

    `options` are loader options (e.g. `selectinload`) for what the caller will render.
    """
    stmt = statement(flt).options(*options)
    letters, next_cursor = paginate(session, stmt, DeadLetter.id, limit=limit, cursor=cursor)
    return SearchPage(
        letters,
        next_cursor,
        partner_uids(session, letters),
        delivered_versions(session, [letter.delivery_id for letter in letters]),
    )


def partner_uids(session: Session, letters: list[DeadLetter]) -> dict[str, str]:
    ids = {letter.partner_id for letter in letters}
    if not ids:
        return {}
    rows = session.execute(select(Partner.id, Partner.uid).where(Partner.id.in_(ids)))
    return {pid: uid for pid, uid in rows}


def count(session: Session, flt: DeadLetterFilter, *, max_id: str | None = None) -> int:
    stmt = select(func.count()).select_from(DeadLetter)
    where = conditions(flt)
    if max_id is not None:
        where.append(DeadLetter.id <= max_id)
    if where:
        stmt = stmt.where(and_(*where))
    return int(session.scalar(stmt) or 0)


def newest_id(session: Session) -> str | None:
    """The newest letter id, used to freeze "everything matching" at the moment of asking."""
    return session.scalar(select(func.max(DeadLetter.id)))
