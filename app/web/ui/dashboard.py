"""The dashboard: what needs an operator's look now (`app.services.dashboard` reads it)."""

from __future__ import annotations

from flask import render_template

from app.services import dashboard, endpoints
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, blueprint


@blueprint.get("/", endpoint="dashboard")
@security.login_required
def dashboard_page() -> Page:
    rt = runtime()
    actor = security.actor()
    try:
        queues = dashboard.queues(actor, rt.redis)
        queue_error = None
    except Exception as exc:  # Redis down must not take the dashboard with it
        queues, queue_error = [], f"Redis is not reachable ({type(exc).__name__})"
    with rt.db.begin() as session:
        found = dashboard.overview(session, actor)
        return render_template(
            "ui/dashboard.html",
            chart=found.chart,
            in_flight=found.in_flight,
            open_letters=found.open_letters,
            quarantined=found.quarantined,
            disabled=found.disabled,
            partners=found.partner_uids,
            events=found.events,
            blocked=found.blocked,
            held=found.held,
            failing=found.failing,
            failing_streak=endpoints.FAILING_STREAK,
            queues=queues,
            queue_error=queue_error,
        )
