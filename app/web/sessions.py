"""Browser sessions of the two server-rendered faces: the operator UI and the partner portal.

Each face has its own signed cookie — its own name, path, salt and SameSite rule — so a cookie
of one face is never read by the other, and the API and the inbound receiver never pay for a
session at all. The signing key is derived from Kurir's master secret (KURIR_SECRET_KEY, or the
dev key in the data dir) with an HMAC under a fixed label, so every API process agrees on it
without a new setting, and the master key itself never signs cookies.

The portal may be shown in another site's `<iframe>` (KURIR_PORTAL_FRAME_ANCESTORS): a cookie
set there is a third-party cookie, which browsers send only when it is `SameSite=None; Secure`
(and keep, where third-party cookies are blocked, only when `Partitioned`). So the portal's
cookie is all three whenever framing is allowed and the cookie can be Secure; otherwise it is
`SameSite=Lax` like the UI's. CSRF tokens on every form are what protect a `SameSite=None`
cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any

from flask import Flask, request
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer

from app.crypto import DEV_KEY_FILE
from app.runtime import Runtime

SESSION_LABEL = b"kurir/ui-session/v1"


@dataclass(frozen=True)
class Face:
    """Where a face lives and what its cookie is called."""

    prefix: str
    cookie: str
    salt: str
    framable: bool = False


UI = Face("/ui", "kurir_session", "cookie-session")
PORTAL = Face("/portal", "kurir_portal", "kurir-portal-session", framable=True)
FACES = (UI, PORTAL)


def face_of(path: str) -> Face | None:
    for face in FACES:
        if path == face.prefix or path.startswith(face.prefix + "/"):
            return face
    return None


def session_secret(rt: Runtime) -> str:
    """A stable, purpose-bound key for signing the session cookies."""
    material = rt.settings.secret_key
    if material:
        material = material.split(",")[0].strip()
    else:
        rt.secret_box  # noqa: B018 - generates the dev key file once if it is missing
        material = (rt.settings.data_dir / DEV_KEY_FILE).read_text().strip()
    return hmac.new(material.encode(), SESSION_LABEL, hashlib.sha256).hexdigest()


def host_is_loopback(host_header: str | None) -> bool:
    """Whether a Host value (`name[:port]`, `[v6][:port]`) names a loopback address: the
    name `localhost` or a loopback IP literal (not a name that merely starts with `127.`)."""
    value = (host_header or "").strip().lower()
    host = value.split("]")[0].lstrip("[") if value.startswith("[") else value.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_plain_http(req: Any) -> bool:
    """Whether this request reached us over plain HTTP at a loopback address (a laptop)."""
    return not req.is_secure and host_is_loopback(req.host)


def cookie_secure(rt: Runtime, req: Any) -> bool:
    """KURIR_COOKIE_SECURE when set; otherwise Secure unless the page is served over plain
    HTTP on a loopback address, where a browser would refuse to keep a Secure cookie."""
    configured = rt.settings.cookie_secure
    if configured is not None:
        return configured
    return rt.settings.require_https or not is_loopback_plain_http(req)


def third_party(rt: Runtime, req: Any, face: Face) -> bool:
    """Whether this face's cookie must work inside another site's frame."""
    return face.framable and rt.settings.portal_framable and cookie_secure(rt, req)


class FaceSessionInterface(SecureCookieSessionInterface):
    """One signed cookie per face, chosen by the request path; none outside the faces."""

    def _face(self) -> Face | None:
        return face_of(request.path)

    def open_session(self, app: Flask, request: Any) -> SecureCookieSession | None:
        if face_of(request.path) is None:
            return None  # Flask substitutes its cheap null session
        return super().open_session(app, request)

    def get_signing_serializer(self, app: Flask) -> URLSafeTimedSerializer | None:
        face = self._face()
        if not app.secret_key or face is None:
            return None
        return URLSafeTimedSerializer(
            app.secret_key,
            salt=face.salt,
            serializer=self.serializer,
            signer_kwargs={
                "key_derivation": self.key_derivation,
                "digest_method": self.digest_method,
            },
        )

    def get_cookie_name(self, app: Flask) -> str:
        face = self._face()
        return face.cookie if face is not None else UI.cookie

    def get_cookie_path(self, app: Flask) -> str:
        face = self._face()
        return face.prefix if face is not None else UI.prefix

    def get_cookie_secure(self, app: Flask) -> bool:
        return cookie_secure(app.extensions["kurir"], request)

    def get_cookie_samesite(self, app: Flask) -> str:
        face = self._face()
        if face is not None and third_party(app.extensions["kurir"], request, face):
            return "None"
        return "Lax"

    def get_cookie_partitioned(self, app: Flask) -> bool:
        face = self._face()
        return face is not None and third_party(app.extensions["kurir"], request, face)


def configure(app: Flask, rt: Runtime, lifetime: Any) -> None:
    app.secret_key = session_secret(rt)
    app.session_interface = FaceSessionInterface()
    app.config.update(SESSION_COOKIE_HTTPONLY=True, PERMANENT_SESSION_LIFETIME=lifetime)
