"""Liveness and readiness probes for load balancers and orchestrators."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from app.web.context import runtime

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@blueprint.get("/readyz")
def readyz() -> tuple[Response, int]:
    """200 only when both stores answer; otherwise 503 naming the one that did not."""
    rt = runtime()
    checks: dict[str, str] = {}
    try:
        rt.db.ping()
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        rt.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    failed = [name for name, state in checks.items() if state != "ok"]
    if failed:
        body = {
            "status": "unavailable",
            "checks": checks,
            "error": {
                "code": "not_ready",
                "message": f"not reachable: {', '.join(failed)}",
                "details": {"failed": failed},
            },
        }
        return jsonify(body), 503
    return jsonify({"status": "ok", "checks": checks}), 200
