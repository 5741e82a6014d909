"""The HTML error pages of the operator UI and the partner portal, written once.

Both faces answer a refused form token, an HTTP error and an unexpected exception the same
way — a page in their own layout saying what happened and that nothing was changed — and
differ only in the template and in what they call themselves.
"""

from __future__ import annotations

import logging

from flask import Blueprint, render_template, request
from werkzeug.exceptions import HTTPException

from app.web.logpath import loggable_path

log = logging.getLogger(__name__)

Page = tuple[str, int]


def register(blueprint: Blueprint, template: str, *, page: str, speaker: str) -> None:
    """Answer HTTP errors and unexpected exceptions of `blueprint` with `template`; `page` and
    `speaker` are how the message names the face ("a current portal page", "The portal")."""

    def http_error(exc: HTTPException) -> Page:
        status = exc.code or 500
        if status == 400 and exc.description == "csrf":
            return render_template(
                template,
                status=400,
                title="This form has expired",
                message=f"The form was not sent from a current {page} page: its security "
                "token (CSRF) is missing or wrong, so nothing was changed. Reload the "
                "page and try again.",
            ), 400
        return render_template(
            template, status=status, title=exc.name, message=exc.description
        ), status

    def unexpected(exc: Exception) -> Page:
        log.error(
            "unhandled error on %s %s", request.method, loggable_path(request.path), exc_info=exc
        )
        return render_template(
            template,
            status=500,
            title="Something went wrong",
            message=f"{speaker} hit an internal error; it is logged. Nothing "
            "was changed by the failed request.",
        ), 500

    blueprint.register_error_handler(HTTPException, http_error)
    blueprint.register_error_handler(Exception, unexpected)
