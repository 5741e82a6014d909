"""SSRF guard: decide, from one resolution, whether an outbound target may be contacted."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from app.config import Settings

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
Resolver = Callable[[str, int], list[str]]

ALLOWED_SCHEMES: dict[str, int] = {"http": 80, "https": 443}

# Explicit tables, because ipaddress.is_global/is_private are wrong for several ranges
# (multicast, 6to4, NAT64, site-local…) and have changed between Python patch releases.
BLOCKED_V4: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified/this-network"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space (CGNAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved/broadcast"),
    )
)

BLOCKED_V6: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(net), why)
    for net, why in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation"),
        ("100::/64", "discard-only"),
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)

# Ranges that carry an IPv4 address: judged by that address. (network, first bit of the v4)
EMBEDDED_V4: tuple[tuple[IPv6Network, int, str], ...] = (
    (IPv6Network("::ffff:0:0/96"), 96, "IPv4-mapped"),
    (IPv6Network("::ffff:0:0:0/96"), 96, "IPv4-translated"),
    (IPv6Network("64:ff9b::/96"), 96, "NAT64"),
    (IPv6Network("2002::/16"), 16, "6to4"),
    (IPv6Network("::/96"), 96, "IPv4-compatible"),
)

# Everything outside global unicast (2000::/3) is reserved by the IETF, once the special
# forms above have been handled.
GLOBAL_UNICAST_V6 = IPv6Network("2000::/3")

# WHATWG "forbidden host code points" plus whitespace: never valid in a host name.
_FORBIDDEN_HOST_CHARS = re.compile(r"[\x00-\x20\x7f#%/:<>?@\[\\\]^|]")
_NUMERIC_LABEL = re.compile(r"^(?:0[xX][0-9a-fA-F]*|[0-9]+)$")


class InvalidURL(ValueError):
    """Raised for URLs Kurir refuses to send to, so callers can answer 422 rather than 500."""


class BlockedAddress(Exception):
    """Raised when a target is internal, so the refusal carries a reason operators can read."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ResolutionError(OSError):
    """Raised when a name does not resolve, so it is reported as a connection problem."""


@dataclass(frozen=True)
class GuardPolicy:
    """Which internal targets are allowed, passed explicitly so the guard needs no settings."""

    allow_private: bool = False
    allow_cidrs: tuple[IPNetwork, ...] = ()
    require_https: bool = False

    def __post_init__(self) -> None:
        """Accept CIDR strings too, so configuration can be passed through unchanged."""
        nets = tuple(
            n if isinstance(n, IPv4Network | IPv6Network) else ip_network(n)
            for n in self.allow_cidrs
        )
        object.__setattr__(self, "allow_cidrs", nets)


def policy_from(settings: Settings) -> GuardPolicy:
    """The policy configured by KURIR_ALLOW_PRIVATE_TARGETS, _ALLOWED_CIDRS, _REQUIRE_HTTPS."""
    return GuardPolicy(
        allow_private=settings.allow_private_targets,
        allow_cidrs=tuple(ip_network(cidr, strict=False) for cidr in settings.allowed_cidrs),
        require_https=settings.require_https,
    )


def default_resolver(host: str, port: int) -> list[str]:
    """Resolve with the system resolver, the same lookup a plain connect would do."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


def _parse_ipv4_part(part: str) -> int | None:
    """Read one inet_aton component (decimal, 0-octal or 0x-hex) the way libc does."""
    if part[:2] in ("0x", "0X"):
        digits = part[2:]
        # A bare "0x" is 0 to browsers but an error to libc: refuse the ambiguity.
        if digits == "" or not all(c in "0123456789abcdefABCDEF" for c in digits):
            return None
        return int(digits, 16)
    if not part.isascii() or not part.isdigit():
        return None
    if len(part) > 1 and part[0] == "0":
        if not all(c in "01234567" for c in part):
            return None
        return int(part, 8)
    return int(part, 10)


def parse_ipv4_literal(host: str) -> IPv4Address | None:
    """Recognise every IPv4 spelling libc/browsers accept (127.1, 0x7f.1, 2130706433, …)."""
    text = host[:-1] if host.endswith(".") else host
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        return None
    values: list[int] = []
    for part in parts:
        value = _parse_ipv4_part(part)
        if value is None:
            return None
        values.append(value)
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = 0
    for v in head:
        number = number << 8 | v
    number = number << (8 * (5 - len(values))) | last
    return IPv4Address(number)


def parse_ipv6_literal(host: str) -> IPv6Address | None:
    """Parse an IPv6 literal with optional brackets and zone id, dropping the zone."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" not in text:
        return None
    addr_text = text.split("%", 1)[0]
    try:
        return IPv6Address(addr_text)
    except ValueError:
        return None


def parse_ip_literal(host: str) -> IPAddress | None:
    """Return the address a host literal denotes, or None when it is a name to resolve."""
    return parse_ipv6_literal(host) or parse_ipv4_literal(host)


def looks_numeric(host: str) -> bool:
    """Tell whether a host ends in a number, which browsers treat as a (maybe bad) IPv4 literal."""
    text = host[:-1] if host.endswith(".") else host
    last = text.rsplit(".", 1)[-1]
    return bool(_NUMERIC_LABEL.fullmatch(last))


def _embedded_ipv4(addr: IPv6Address) -> tuple[IPv4Address, str] | None:
    """Extract the IPv4 address carried by mapped, compatible, NAT64 or 6to4 forms."""
    for net, first_bit, kind in EMBEDDED_V4:
        if addr in net:
            shift = 128 - first_bit - 32
            return IPv4Address((int(addr) >> shift) & 0xFFFFFFFF), kind
    return None


def _strip_scope(addr: IPAddress) -> IPAddress:
    """Drop an IPv6 zone id so network membership is decided on the bare address."""
    if isinstance(addr, IPv6Address) and addr.scope_id is not None:
        return IPv6Address(int(addr))
    return addr


def blocked_reason(addr: IPAddress) -> str | None:
    """Say why an address is internal (None when it is public), for error messages."""
    addr = _strip_scope(addr)
    if isinstance(addr, IPv4Address):
        for net, why in BLOCKED_V4:
            if addr in net:
                return f"{why} ({net})"
        return None
    for net6, why6 in BLOCKED_V6[:2]:
        if addr in net6:
            return f"{why6} ({net6})"
    embedded = _embedded_ipv4(addr)
    if embedded is not None:
        v4, kind = embedded
        inner = blocked_reason(v4)
        return None if inner is None else f"{kind} {v4}: {inner}"
    for net6, why6 in BLOCKED_V6[2:]:
        if addr in net6:
            return f"{why6} ({net6})"
    if addr not in GLOBAL_UNICAST_V6:
        return "reserved (outside 2000::/3)"
    return None


def is_blocked_ip(addr: IPAddress) -> bool:
    """Tell whether an address is internal or reserved, by the explicit tables above."""
    return blocked_reason(addr) is not None


def _in_any(addr: IPAddress, nets: Iterable[IPNetwork]) -> bool:
    """Check membership across mixed-family networks without TypeErrors."""
    return any(addr.version == net.version and addr in net for net in nets)


def is_allowed_ip(addr: IPAddress, policy: GuardPolicy) -> bool:
    """Apply the policy's exceptions on top of the blocklist verdict."""
    if policy.allow_private:
        return True
    addr = _strip_scope(addr)
    if not is_blocked_ip(addr):
        return True
    if _in_any(addr, policy.allow_cidrs):
        return True
    if isinstance(addr, IPv6Address):
        embedded = _embedded_ipv4(addr)
        if embedded is not None and _in_any(embedded[0], policy.allow_cidrs):
            return True
    return False


def _is_localhost_name(host: str) -> bool:
    """Refuse localhost names outright: resolvers may answer them without DNS (RFC 6761)."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def _check_one(addr: IPAddress, host: str, policy: GuardPolicy) -> None:
    """Raise BlockedAddress for an address the policy does not allow."""
    if not is_allowed_ip(addr, policy):
        reason = blocked_reason(addr) or "blocked"
        raise BlockedAddress(f"{host} -> {addr} is a blocked address: {reason}")


def check_host(
    host: str,
    port: int,
    policy: GuardPolicy,
    resolver: Resolver = default_resolver,
) -> list[str]:
    """Resolve once and vet every answer, so the caller can connect to a checked address."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    name = name.lower()
    if not name or name == ".":
        raise InvalidURL("empty host")
    if _is_localhost_name(name) and not policy.allow_private:
        raise BlockedAddress(f"{host} is a localhost name")

    literal = parse_ip_literal(name)
    if literal is not None:
        _check_one(literal, host, policy)
        if isinstance(literal, IPv6Address) and "%" in name:
            return [f"{literal}%{name.split('%', 1)[1]}"]
        return [str(literal)]
    if ":" in name or looks_numeric(name):
        raise InvalidURL(f"{host!r} is neither a valid IP address nor a host name")
    if _FORBIDDEN_HOST_CHARS.search(name):
        raise InvalidURL(f"{host!r} contains characters not allowed in a host name")

    try:
        answers = resolver(name.rstrip("."), port)
    except ResolutionError:
        raise
    except (OSError, UnicodeError) as exc:
        raise ResolutionError(f"cannot resolve {host}: {exc}") from exc
    if not answers:
        raise ResolutionError(f"{host} resolves to no address")

    checked: list[str] = []
    for answer in answers:
        addr = parse_ip_literal(answer)
        if addr is None:
            raise BlockedAddress(f"{host} resolves to {answer!r}, which is not an IP address")
        _check_one(addr, host, policy)
        text = answer if "%" in answer else str(addr)
        if text not in checked:
            checked.append(text)
    return checked


def split_url(url: str, policy: GuardPolicy | None = None) -> tuple[str, str, int]:
    """Validate a URL's syntax and return (scheme, host, port) without any network access."""
    if not isinstance(url, str):
        raise InvalidURL("URL must be a string")
    if re.search(r"[\x00-\x20\x7f\\]", url):
        raise InvalidURL("URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(f"malformed URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise InvalidURL(f"scheme {parts.scheme!r} is not allowed; use http or https")
    if policy is not None and policy.require_https and scheme != "https":
        raise InvalidURL("https is required")
    hostport = parts.netloc.rpartition("@")[2]
    hostname = parts.hostname
    if not hostname:
        raise InvalidURL("URL has no host")
    if hostport.startswith("["):
        if parse_ipv6_literal(hostname) is None:
            raise InvalidURL(f"[{hostname}] is not a valid IPv6 address")
        host = unquote(hostname)
    else:
        host = unquote(hostname).lower()
        if "%" in host or ":" in host:
            raise InvalidURL(f"invalid host {hostname!r}")
    if port is None:
        port = ALLOWED_SCHEMES[scheme]
    if not 0 < port < 65536:
        raise InvalidURL(f"invalid port {port}")
    if host.endswith(".") and host != ".":
        host = host[:-1]
    return scheme, host, port


def check_url(
    url: str,
    policy: GuardPolicy,
    resolver: Resolver = default_resolver,
) -> tuple[str, int, list[str]]:
    """Validate scheme and host of a URL, then resolve and vet it once: (host, port, addrs)."""
    _scheme, host, port = split_url(url, policy)
    return host, port, check_host(host, port, policy, resolver)
