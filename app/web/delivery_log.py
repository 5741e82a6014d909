"""The delivery log as a page: one implementation behind two faces.

The operator UI (`/ui/deliveries`) and the partner portal (`/portal/deliveries`) read the
same filter from the query string, call the same service (`app.services.deliveries.page`,
which keeps a partner to its own deliveries) and render the same template pieces
(`shared/_delivery_log.html`, `shared/_delivery.html`); only the links differ, and each face
passes its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from app.models import DELIVERY_STATES
from app.pagination import parse_limit
from app.services import deliveries, list_filters
from app.services.actor import Actor
from app.web import timeinput

FILTER_KEYS = deliveries.FILTER_KEYS


def log_context(
    session: Session,
    actor: Actor,
    args: Mapping[str, str],
    *,
    list_url: Callable[..., str],
    fixed: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything `shared/_delivery_log.html` needs: rows, the form as typed, its errors and
    the pager links. `fixed` criteria (a portal page's endpoint) are not the visitor's to
    change."""
    given = timeinput.normalise(args)
    typed = {key: (given.get(key) or "").strip() for key in FILTER_KEYS}
    typed.update(fixed or {})
    flt, errors = deliveries.DeliveryFilter.parse(typed)
    missing = list_filters.unknown(session, actor, partner=flt.partner, endpoint=flt.endpoint)
    errors.update(missing)
    limit = parse_limit(args.get("limit") or "50")
    cursor = args.get("cursor") or None
    page = (
        deliveries.LogPage([], None)
        if missing
        else deliveries.page(session, actor, flt, limit=limit, cursor=cursor)
    )
    query = {k: v for k, v in typed.items() if v and k not in (fixed or {})}
    return {
        "page": page,
        "args": typed,
        "errors": errors,
        "unknown": missing,
        "choices": list_filters.choices(
            session, actor, partner=None if "partner" in missing else flt.partner
        ),
        "states": DELIVERY_STATES,
        "filtered": any(v for k, v in typed.items() if k not in (fixed or {})),
        "next_url": list_url(**query, cursor=page.next_cursor) if page.next_cursor else None,
        "first_url": list_url(**query) if cursor else None,
    }
