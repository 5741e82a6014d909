"""Believing X-Forwarded-* only from the proxies the operator named (KURIR_TRUSTED_PROXIES).

Behind a proxy every request comes from the proxy's address, so the sign-in throttle would
count every operator as one client and lock them all out together; believing the header from
anyone else would let a client pick its own address. Two ways to name the proxies:

- a hop count `N`: exactly N proxies in front, each appending to X-Forwarded-For (werkzeug's
  ProxyFix with x_for, x_proto, x_host = N);
- their networks (`10.0.0.0/8,192.168.1.5`): the header is believed only when the peer is in
  them, and the client is the right-most address of X-Forwarded-For that is not.

With neither, a request that arrives carrying X-Forwarded-For says a proxy is in front that
nobody named: the first one is logged as a warning (once per process), since every client
then shares the proxy's address.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.middleware.proxy_fix import ProxyFix

log = logging.getLogger(__name__)

WSGIApp = Callable[..., Any]


class UntrustedForwardWarning:
    """No proxy is trusted: say so, once, when a request shows that one is in front."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.warned = False

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if not self.warned and environ.get("HTTP_X_FORWARDED_FOR"):
            self.warned = True
            log.warning(
                "a request came with X-Forwarded-For but KURIR_TRUSTED_PROXIES is unset: the "
                "header is ignored, so every client behind that proxy has the proxy's address "
                "(%s) and the sign-in throttle counts them all as one client. Set "
                "KURIR_TRUSTED_PROXIES to the proxy's hop count or networks.",
                environ.get("REMOTE_ADDR", "?"),
            )
        return self.app(environ, start_response)


class TrustedNetworks:
    """X-Forwarded-For / -Proto from peers inside the given networks only."""

    def __init__(self, app: WSGIApp, networks: Iterable[str]) -> None:
        self.app = app
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        peer = environ.get("REMOTE_ADDR", "")
        if self._trusted(peer):
            hops = [
                h.strip() for h in environ.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()
            ]
            client = peer
            while hops:
                candidate = hops.pop()
                client = candidate
                if not self._trusted(candidate):
                    break
            environ["kurir.peer_addr"] = peer
            environ["REMOTE_ADDR"] = client
            proto = environ.get("HTTP_X_FORWARDED_PROTO", "").split(",")[-1].strip().lower()
            if proto in ("http", "https"):
                environ["wsgi.url_scheme"] = proto
        return self.app(environ, start_response)


def wrap(app: WSGIApp, trusted: int | tuple[str, ...]) -> WSGIApp:
    """`app` behind the configured proxies (when none are trusted: warning if one shows)."""
    if isinstance(trusted, int):
        if trusted <= 0:
            return UntrustedForwardWarning(app)
        return ProxyFix(app, x_for=trusted, x_proto=trusted, x_host=trusted)
    return TrustedNetworks(app, trusted) if trusted else UntrustedForwardWarning(app)
