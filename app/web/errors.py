"""Every error, ours or Flask's, leaves as `{"error": {"code", "message", "details"}}`."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from app.errors import KurirError, PayloadTooLarge
from app.web.logpath import loggable_path

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_failed",
    429: "rate_limited",
    503: "unavailable",
}


def error_response(status: int, code: str, message: str, details: object = None) -> Response:
    response = jsonify({"error": {"code": code, "message": message, "details": details}})
    response.status_code = status
    return response


def register(app: Flask) -> None:
    @app.errorhandler(KurirError)
    def _kurir_error(exc: KurirError) -> Response:
        response = error_response(exc.status, exc.code, exc.message, exc.details)
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="kurir"'
        if exc.retry_after_s is not None:
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        if status == 413:
            too_large = PayloadTooLarge.over(app.config["MAX_CONTENT_LENGTH"])
            return error_response(status, code, too_large.message, too_large.details)
        response = error_response(status, code, exc.description or exc.name)
        if status == 405 and hasattr(exc, "valid_methods") and exc.valid_methods:
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    def _log_exception(exc_info: Any) -> None:
        # Flask's own line for what escapes every handler (a failing after_request, a cookie
        # that cannot be saved) names the raw path: a magic link's token with it.
        app.logger.error(
            "Exception on %s [%s]", loggable_path(request.path), request.method, exc_info=exc_info
        )

    app.log_exception = _log_exception  # type: ignore[method-assign]

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.error(
            "unhandled error on %s %s", request.method, loggable_path(request.path), exc_info=exc
        )
        return error_response(500, "internal_error", "internal server error")
