"""The statements of the publish hot path, built once at import.

Constructing a select or an insert per request costs more CPU than executing it, and every
bind parameter costs the client CPU to adapt: constants are inlined, and binds are reused
between the parts of one statement.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    Table,
    Text,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    true,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import aggregate_order_by

from app import event_types
from app.models import PENDING, Delivery, Endpoint, Event, EventType, EventVersion, Partner

PARTNERS = cast(Table, Partner.__table__)
ENDPOINTS = cast(Table, Endpoint.__table__)
EVENTS = cast(Table, Event.__table__)
DELIVERIES = cast(Table, Delivery.__table__)
EVENT_TYPES = cast(Table, EventType.__table__)
EVENT_VERSIONS = cast(Table, EventVersion.__table__)
# What a publish writes: the feed position is given after commit (app.feed), never here.
EVENT_COLUMNS = tuple(c.name for c in EVENTS.columns if c.name != "feed_seq")
_DELIVERY_COLUMNS = (
    "id",
    "endpoint_id",
    "event_id",
    "state",
    "attempt_count",
    "run_attempts",
    "run",
    "next_attempt_at",
    "created_at",
    "updated_at",
)


def endpoints_digest(partner_id: Any) -> Any:
    """PostgreSQL: md5 over what a publish plan depends on — each live endpoint's id, state,
    subscription, version pins, ordering and filter — so that a plan made from an earlier read
    can be checked in the write.
    """
    e = ENDPOINTS
    colon: Any = literal_column("':'")
    entry = (
        e.c.id
        + colon
        + e.c.state
        + colon
        + func.coalesce(sql_cast(e.c.event_types, Text), literal_column("'*'"))
        + colon
        + func.coalesce(sql_cast(e.c.versions, Text), literal_column("''"))
        + colon
        + e.c.ordering
        + colon
        + func.md5(func.coalesce(e.c.filter, literal_column("''")))
    )
    listing = func.string_agg(entry, aggregate_order_by(literal_column("','"), e.c.id))
    return (
        select(func.md5(func.coalesce(listing, literal_column("''"))))
        .where(e.c.partner_id == partner_id, e.c.deleted_at.is_(None))
        .correlate(None)
        .scalar_subquery()
    )


def _targets(*, with_digest: bool) -> Any:
    """The partner, its live endpoints and the contract (row id, deprecated), in one query.

    The outer join keeps a partner without endpoints; the contract and the digest ride along
    as scalar subqueries.
    """
    columns = [
        PARTNERS.c.id.label("partner_id"),
        ENDPOINTS.c.id.label("endpoint_id"),
        ENDPOINTS.c.state,
        ENDPOINTS.c.event_types,
        ENDPOINTS.c.versions,
        ENDPOINTS.c.mode,
        ENDPOINTS.c.ordering,
        ENDPOINTS.c.filter,
        *event_types.lookup_columns(bindparam("type_name"), bindparam("type_version")),
    ]
    if with_digest:
        # Uncorrelated (by uid, not by the joined row), so it is computed once, not per row.
        partner_id = select(PARTNERS.c.id).where(PARTNERS.c.uid == bindparam("uid"))
        columns.append(endpoints_digest(partner_id.scalar_subquery()).label("digest"))
    return (
        select(*columns)
        .select_from(
            PARTNERS.outerjoin(
                ENDPOINTS,
                and_(ENDPOINTS.c.partner_id == PARTNERS.c.id, ENDPOINTS.c.deleted_at.is_(None)),
            )
        )
        .where(PARTNERS.c.uid == bindparam("uid"))
        .order_by(ENDPOINTS.c.id)
    )


def _typed(table: Table, prefix: str) -> dict[str, Any]:
    """`column: bindparam` for every column, typed so JSON and UTC times are converted."""
    return {c.name: bindparam(f"{prefix}{c.name}", type_=c.type) for c in table.columns}


def _event_with_deliveries(*, guarded: bool) -> Any:
    """PostgreSQL: the event and every delivery of its fan-out in one statement.

    The event is a data-modifying CTE; the deliveries come from two parallel arrays (ids,
    endpoint ids) joined to it. One statement is atomic on its own, so on an autocommit
    connection it is the whole transaction.

    Guarded, the event is only written if the partner's endpoints still have the digest the
    plan was made from (bind `digest`); otherwise nothing is written. The statement then
    answers (events written: 0 or 1, the contract's current `deprecated` flag; bind
    `type_id`).
    """
    event = {name: bind for name, bind in _typed(EVENTS, "e_").items() if name in EVENT_COLUMNS}
    if guarded:
        guard = (
            select(PARTNERS.c.id)
            .where(
                PARTNERS.c.id == event["partner_id"],
                endpoints_digest(event["partner_id"]) == bindparam("digest"),
            )
            .cte("guard")
        )
        values = select(
            *[guard.c.id if name == "partner_id" else event[name] for name in EVENT_COLUMNS]
        )
        new_event = (
            insert(EVENTS)
            .from_select(EVENT_COLUMNS, values)
            .returning(EVENTS.c.id)
            .cte("new_event")
        )
    else:
        new_event = insert(EVENTS).values(**event).returning(EVENTS.c.id).cte("new_event")
    pairs = (
        func.unnest(
            bindparam("d_ids", type_=ARRAY(Text)), bindparam("d_endpoint_ids", type_=ARRAY(Text))
        )
        .table_valued("id", "endpoint_id")
        .render_derived()
    )
    created = event["created_at"]
    rows = select(
        pairs.c.id,
        pairs.c.endpoint_id,
        new_event.c.id,
        literal_column(f"'{PENDING}'"),
        literal_column("0"),
        literal_column("0"),
        literal_column("1"),
        created,
        created,
        created,
    ).select_from(pairs.join(new_event, true()))
    # Columns left out take their server defaults (include_defaults would bind Python ones).
    deliveries = insert(DELIVERIES).from_select(_DELIVERY_COLUMNS, rows, include_defaults=False)
    if not guarded:
        return deliveries
    written = select(func.count()).select_from(new_event).scalar_subquery()
    contract = EVENT_TYPES.c.id == bindparam("type_id")
    deprecated = select(EVENT_TYPES.c.deprecated).where(contract).scalar_subquery()
    sunset_at = select(EVENT_TYPES.c.sunset_at).where(contract).scalar_subquery()
    return select(written, deprecated, sunset_at).add_cte(deliveries.cte("new_deliveries"))


def event_params(
    event_values: dict[str, Any], deliveries: list[tuple[str, str, int | None]]
) -> dict[str, Any]:
    """Binds of the event-with-deliveries statements."""
    params = {f"e_{name}": event_values.get(name) for name in EVENT_COLUMNS}
    params["d_ids"] = [delivery[0] for delivery in deliveries]
    params["d_endpoint_ids"] = [delivery[1] for delivery in deliveries]
    return params


TARGETS = _targets(with_digest=False)
TARGETS_WITH_DIGEST = _targets(with_digest=True)
EVENT_WITH_DELIVERIES = _event_with_deliveries(guarded=False)
GUARDED_EVENT_WITH_DELIVERIES = _event_with_deliveries(guarded=True)
EVENT = insert(EVENTS)
EVENT_VERSION = insert(EVENT_VERSIONS)
DELIVERY = insert(DELIVERIES)
