"""Operator pages for partners: who they are, their endpoints and API keys, what they did in
the portal — "open portal as this partner", which makes a one-time link (audited as the
operator; what is then done in the portal is audited as `portal:<uid>`, naming that session),
and "end all portal sessions", which withdraws every way into the partner's portal.
"""

from __future__ import annotations

from datetime import timedelta

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.clock import utcnow
from app.pagination import parse_limit
from app.services import audit, endpoints, keys, partners, portal
from app.web.context import runtime
from app.web.links import portal_url
from app.web.ui import security
from app.web.ui.base import Page, blueprint


@blueprint.get("/partners", endpoint="partners")
@security.login_required
def partners_page() -> Page:
    with runtime().db.begin() as session:
        rows, next_cursor = partners.page(
            session,
            security.actor(),
            limit=parse_limit(request.args.get("limit") or "50"),
            cursor=request.args.get("cursor"),
        )
        return render_template(
            "ui/partners.html",
            partners=rows,
            next_url=url_for("ui.partners", cursor=next_cursor) if next_cursor else None,
        )


@blueprint.get("/partners/<uid>")
@security.login_required
def partner(uid: str) -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        found = partners.get(session, actor, uid)
        live, _ = endpoints.page(session, actor, uid, limit=100, cursor=None)
        partner_keys, _ = keys.page(session, actor, limit=100, cursor=None, partner_uid=uid)
        activity, _ = audit.search(
            session, actor, partner_id=found.id, actor_prefix="portal:", limit=20
        )
        return render_template(
            "ui/partner.html",
            partner=found,
            endpoints=live,
            keys=partner_keys,
            activity=activity,
            health=endpoints.health(session, actor, live, since=utcnow() - timedelta(hours=24)),
            link_ttl=runtime().settings.portal_link_ttl_seconds,
            portal_features=portal.FEATURES,
        )


@blueprint.post("/partners/<uid>/portal-link")
@security.login_required
def partner_portal_link(uid: str) -> WerkzeugResponse:
    """A one-time link into the partner's portal, answered by a redirect to the page that
    shows it (once): reloading that page mints no second link. The form may narrow the
    session (read-only, some sections only), for a support engineer or a partner's auditor;
    the service checks the names."""
    rt = runtime()
    actor = security.actor()
    chosen = request.form.getlist("feature")
    with rt.db.begin() as session:
        link, token = portal.create_link(
            session,
            actor,
            uid,
            default_ttl_s=rt.settings.portal_link_ttl_seconds,
            read_only=request.form.get("read_only") == "on",
            features=chosen or None,
        )
        link_id = link.id
        portal.keep_to_show(rt.redis, actor, link, token)
    return redirect(url_for("ui.partner_portal_link_shown", uid=uid, link_id=link_id))


@blueprint.get("/partners/<uid>/portal-links/<link_id>")
@security.login_required
def partner_portal_link_shown(uid: str, link_id: str) -> Page:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        link, token = portal.take_to_show(session, rt.redis, actor, uid, link_id)
        found = partners.get(session, actor, uid)
        return render_template(
            "ui/portal_link.html",
            partner=found,
            link=link,
            scope=portal.scope_of(link),
            url=portal_url(token) if token else None,
        )


@blueprint.post("/partners/<uid>/portal-sessions/revoke")
@security.login_required
def partner_portal_revoke(uid: str) -> WerkzeugResponse:
    """End every portal session and revoke every unused link of the partner (audited as the
    operator, `portal.revoked`)."""
    with runtime().db.begin() as session:
        stopped = portal.revoke_partner(session, security.actor(), uid)
    flash(
        f"Portal access of {uid} withdrawn: {stopped.ended} session(s) ended and "
        f"{stopped.revoked} unused link(s) revoked, in every API process at once.",
        "ok",
    )
    return redirect(url_for("ui.partner", uid=uid))


@blueprint.post("/keys/<key_id>/revoke")
@security.login_required
def key_revoke(key_id: str) -> WerkzeugResponse:
    with runtime().db.begin() as session:
        view = keys.revoke(session, security.actor(), key_id)
        name, uid = view.key.name, view.partner_uid
    flash(
        f"Revoked the key {name!r}: every API process refuses it within a second, and the "
        "portal links it made and their sessions stop working at once.",
        "ok",
    )
    return redirect(url_for("ui.partner", uid=uid) if uid else url_for("ui.partners"))
