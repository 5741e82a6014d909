"""The contracts page: every event type, its versions, schemas, examples and adoption."""

from __future__ import annotations

from flask import render_template

from app.services import event_types
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, blueprint


@blueprint.get("/contracts")
@security.login_required
def contracts() -> Page:
    with runtime().db.begin() as session:
        return render_template(
            "ui/contracts.html", catalog=event_types.catalog(session, security.actor())
        )
