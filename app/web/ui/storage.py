"""The storage page: rows (and bytes) per table, and per kind of history its retention."""

from __future__ import annotations

from flask import render_template

from app.services import lifecycle
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, blueprint


@blueprint.get("/storage")
@security.login_required
def storage() -> Page:
    rt = runtime()
    with rt.db.begin() as session:
        found = lifecycle.storage(session, rt.settings, security.actor())
    return render_template("ui/storage.html", tables=found.tables, kinds=found.kinds)
