"""SSRF guard: every internal range and every odd spelling of one is refused."""

from __future__ import annotations

import socket
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network

import pytest

from app.net import guard
from app.net.guard import BlockedAddress, GuardPolicy, InvalidURL, ResolutionError

DEFAULT = GuardPolicy()


def no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"resolver must not be called for {host!r}")


class Fixed:
    """A fake resolver with canned answers that records its calls."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return list(self.answers)


# --------------------------------------------------------------------- pure verdicts

BLOCKED_ADDRESSES = [
    "0.0.0.0",  # noqa: S104 - an address under test, not a bind
    "0.255.255.255",
    "10.0.0.1",
    "10.255.255.255",
    "100.64.0.1",
    "100.127.255.254",
    "127.0.0.1",
    "127.255.255.254",
    "169.254.0.1",
    "169.254.169.254",
    "172.16.0.1",
    "172.31.255.255",
    "192.0.0.1",
    "192.0.0.170",
    "192.0.2.1",
    "192.88.99.1",
    "192.168.0.1",
    "192.168.255.255",
    "198.18.0.1",
    "198.19.255.255",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:10.1.2.3",
    "::ffff:169.254.169.254",
    "::7f00:1",
    "::a00:1",
    "::0.0.0.2",
    "64:ff9b::7f00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::1",
    "64:ff9b:1::808:808",
    "100::1",
    "2001::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:1ff::1",
    "2001:db8::1",
    "2002:7f00:1::1",
    "2002:a00:1::",
    "2002:a9fe:a9fe::1",
    "3fff::1",
    "fc00::1",
    "fd12:3456:789a::1",
    "fe80::1",
    "febf::1",
    "fec0::1",
    "ff02::1",
    "ff05::1:3",
    "4000::1",
    "::ffff:0:7f00:1",
]

ALLOWED_ADDRESSES = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "100.63.255.255",
    "100.128.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.0.1.1",
    "192.88.98.1",
    "192.169.0.1",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "11.0.0.1",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "2001:200::1",
    "2a00:1450:4001:82b::200e",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",
]


@pytest.mark.parametrize("text", BLOCKED_ADDRESSES)
def test_blocked_addresses(text: str) -> None:
    addr = ip_address(text)
    assert guard.is_blocked_ip(addr)
    assert guard.blocked_reason(addr)


@pytest.mark.parametrize("text", ALLOWED_ADDRESSES)
def test_allowed_addresses(text: str) -> None:
    addr = ip_address(text)
    assert not guard.is_blocked_ip(addr)
    assert guard.blocked_reason(addr) is None


@pytest.mark.parametrize(
    "text", ["224.0.0.1", "ff02::1", "192.88.99.1", "fec0::1", "64:ff9b::7f00:1",
             "2002:7f00:1::1", "::7f00:1"],
)  # fmt: skip
def test_ranges_python_calls_global_are_blocked(text: str) -> None:
    """Python's ipaddress calls each of these global (`is_global` is True on 3.11), yet none
    is a public unicast host: multicast (224.0.0.1, ff02::1), the deprecated 6to4 relay
    anycast (192.88.99.1), IPv6 site-local (fec0::1), and three IPv6 forms that carry
    127.0.0.1 inside them (NAT64 64:ff9b::/96, 6to4 2002::/16, IPv4-compatible ::/96). Its
    answers have also changed between patch releases, so the guard keeps its own tables."""
    assert guard.is_blocked_ip(ip_address(text))


def test_scoped_ipv6_judged_without_zone() -> None:
    assert guard.is_blocked_ip(ip_address("fe80::1%eth0"))


# ------------------------------------------------------------------ literal spellings

LOOPBACK_SPELLINGS = [
    "2130706433",
    "0x7f.1",
    "0x7f000001",
    "0X7F000001",
    "017700000001",
    "127.1",
    "127.0.1",
    "0177.0.0.1",
    "0177.0.0.01",
    "0x7f.0.0.1",
    "0x7f.0x0.0x0.0x1",
    "127.0.0.1.",
    "127.000.000.001",
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_ipv4_spellings_mean_loopback(host: str) -> None:
    assert guard.parse_ip_literal(host) == ip_address("127.0.0.1")
    with pytest.raises(BlockedAddress, match="loopback"):
        guard.check_host(host, 80, DEFAULT, no_dns)


@pytest.mark.parametrize("host", [h for h in LOOPBACK_SPELLINGS if not h.endswith(".")])
def test_ipv4_parser_agrees_with_inet_aton(host: str) -> None:
    assert guard.parse_ipv4_literal(host) == ip_address(socket.inet_aton(host))


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("[::ffff:7f00:1]", "::ffff:7f00:1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe"),
        ("[::1]", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("::1", "::1"),
        ("169.254.169.254", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("[fe80::1%eth0]", "fe80::1"),
        ("fe80::1%25eth0", "fe80::1"),
        ("0", "0.0.0.0"),  # noqa: S104 - an address under test, not a bind
        ("10.1", "10.0.0.1"),
        ("192.168.257", "192.168.1.1"),
    ],
)
def test_literal_spellings_recognised_and_blocked(host: str, expected: str) -> None:
    assert guard.parse_ip_literal(host) == ip_address(expected)
    with pytest.raises(BlockedAddress):
        guard.check_host(host, 443, DEFAULT, no_dns)


@pytest.mark.parametrize(
    "host", ["256.0.0.1", "1.2.3.4.5", "0x100000000", "4294967296", "1.2.3.0x", "08.1.1.1",
             "1.2.3.256", "1..2.3", "example.123", "::g", "1:2"],
)  # fmt: skip
def test_numeric_hosts_that_are_not_addresses_are_invalid(host: str) -> None:
    with pytest.raises(InvalidURL):
        guard.check_host(host, 80, DEFAULT, no_dns)


@pytest.mark.parametrize(
    "host", ["example.com", "a-1.example", "1x.example", "0xzz.example", "xn--bcher-kva.de"],
)  # fmt: skip
def test_names_are_not_literals(host: str) -> None:
    assert guard.parse_ip_literal(host) is None


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.", "api.localhost", "A.B.LocalHost."],
)  # fmt: skip
def test_localhost_names_refused_without_resolving(host: str) -> None:
    with pytest.raises(BlockedAddress, match="localhost"):
        guard.check_host(host, 80, DEFAULT, no_dns)


def test_localhost_lookalikes_are_resolved() -> None:
    resolver = Fixed("93.184.216.34")
    assert guard.check_host("localhost.example.com", 80, DEFAULT, resolver) == ["93.184.216.34"]
    assert guard.check_host("mylocalhost", 80, DEFAULT, resolver) == ["93.184.216.34"]


def test_public_literals_pass_without_resolving() -> None:
    assert guard.check_host("8.8.8.8", 80, DEFAULT, no_dns) == ["8.8.8.8"]
    assert guard.check_host("[2606:4700:4700::1111]", 443, DEFAULT, no_dns) == [
        "2606:4700:4700::1111"
    ]
    assert guard.check_host("134744072", 80, DEFAULT, no_dns) == ["8.8.8.8"]


# ------------------------------------------------------------- resolution and policy


def test_resolves_once_and_returns_checked_addresses() -> None:
    resolver = Fixed("93.184.216.34", "2606:2800:220:1::", "93.184.216.34")
    addrs = guard.check_host("Example.COM.", 8443, DEFAULT, resolver)
    assert addrs == ["93.184.216.34", "2606:2800:220:1::"]
    assert resolver.calls == [("example.com", 8443)]


def test_any_private_answer_blocks_the_host() -> None:
    resolver = Fixed("93.184.216.34", "10.0.0.5", "8.8.8.8")
    with pytest.raises(BlockedAddress) as info:
        guard.check_host("rebind.example", 80, DEFAULT, resolver)
    assert "10.0.0.5" in info.value.reason
    assert "private" in info.value.reason


def test_mapped_private_answer_blocks_the_host() -> None:
    with pytest.raises(BlockedAddress):
        guard.check_host("x.example", 80, DEFAULT, Fixed("8.8.8.8", "::ffff:169.254.169.254"))


def test_allow_private_lifts_the_guard() -> None:
    policy = GuardPolicy(allow_private=True)
    resolver = Fixed("93.184.216.34", "10.0.0.5", "::1")
    assert guard.check_host("mixed.example", 80, policy, resolver) == [
        "93.184.216.34",
        "10.0.0.5",
        "::1",
    ]
    assert guard.check_host("127.1", 80, policy, no_dns) == ["127.0.0.1"]
    assert guard.check_host("localhost", 80, policy, Fixed("127.0.0.1")) == ["127.0.0.1"]


def test_allow_cidrs_lifts_only_that_network() -> None:
    policy = GuardPolicy(allow_cidrs=(ip_network("10.0.0.0/24"),))
    assert guard.check_host("a.example", 80, policy, Fixed("10.0.0.5", "8.8.8.8")) == [
        "10.0.0.5",
        "8.8.8.8",
    ]
    with pytest.raises(BlockedAddress, match="10.0.1.5"):
        guard.check_host("b.example", 80, policy, Fixed("10.0.0.5", "10.0.1.5"))
    with pytest.raises(BlockedAddress):
        guard.check_host("c.example", 80, policy, Fixed("127.0.0.1"))
    with pytest.raises(BlockedAddress):
        guard.check_host("localhost", 80, policy, no_dns)
    assert guard.check_host("::ffff:10.0.0.9", 80, policy, no_dns) == ["::ffff:a00:9"]


def test_allow_cidrs_accepts_strings_and_ipv6() -> None:
    policy = GuardPolicy(allow_cidrs=("fd00::/8", "127.0.0.0/8"))  # type: ignore[arg-type]
    assert policy.allow_cidrs == (IPv6Network("fd00::/8"), IPv4Network("127.0.0.0/8"))
    assert guard.check_host("fd00::1", 80, policy, no_dns) == ["fd00::1"]
    with pytest.raises(BlockedAddress):
        guard.check_host("fc00::1", 80, policy, no_dns)
    with pytest.raises(ValueError, match="host bits"):
        GuardPolicy(allow_cidrs=("10.0.0.1/8",))  # type: ignore[arg-type]


def test_unparseable_answer_is_blocked() -> None:
    with pytest.raises(BlockedAddress):
        guard.check_host("weird.example", 80, DEFAULT, Fixed("not-an-ip"))


def test_resolution_failures() -> None:
    def broken(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(ResolutionError):
        guard.check_host("nxdomain.example", 80, DEFAULT, broken)
    with pytest.raises(ResolutionError):
        guard.check_host("empty.example", 80, DEFAULT, Fixed())


def test_default_resolver_uses_getaddrinfo() -> None:
    assert "127.0.0.1" in guard.default_resolver("127.0.0.1", 80)
    with pytest.raises(BlockedAddress):
        guard.check_host("127.0.0.1", 80, DEFAULT)


# ------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://hooks.example.com/x", "hooks.example.com", 443),
        ("http://hooks.example.com/x", "hooks.example.com", 80),
        ("HTTPS://Hooks.Example.com:8443/x?y=1", "hooks.example.com", 8443),
        ("https://user:pw@hooks.example.com/", "hooks.example.com", 443),
        ("https://hooks.example.com./", "hooks.example.com", 443),
        ("https://exa%6dple.com/", "example.com", 443),
    ],
)
def test_check_url_extracts_host_and_port(url: str, host: str, port: int) -> None:
    resolver = Fixed("93.184.216.34")
    assert guard.check_url(url, DEFAULT, resolver) == (host, port, ["93.184.216.34"])


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/",
        "http://0x7f.1:8080/",
        "http://[::ffff:7f00:1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[::1]:80/",
        "http://[0:0:0:0:0:0:0:1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1%25eth0]/",
        "http://localhost:8080/",
        "http://foo.localhost/",
        "http://127.0.0.1@127.0.0.1/",
        "http://evil.example@127.0.0.1/",
    ],
)
def test_check_url_blocks_internal_targets(url: str) -> None:
    with pytest.raises(BlockedAddress):
        guard.check_url(url, DEFAULT, no_dns)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "file:///etc/passwd",
        "gopher://example.com/",
        "javascript:alert(1)",
        "example.com/path",
        "http:///nohost",
        "http://",
        "http://example.com:99999/",
        "http://example.com:0/",
        "http://example.com:abc/",
        "http://exa mple.com/",
        "http://example.com\\@127.0.0.1/",
        "http://example.com/\r\nX: y",
        " http://example.com/",
        "http://[v1.abc]/",
        "http://[::1/",
        "http://exa%2fmple.com/",
        "http://1.2.3.4.5/",
    ],
)
def test_check_url_rejects_invalid_urls(url: str) -> None:
    with pytest.raises(InvalidURL):
        guard.check_url(url, DEFAULT, Fixed("93.184.216.34"))


def test_invalid_url_is_a_value_error() -> None:
    assert issubclass(InvalidURL, ValueError)


def test_require_https() -> None:
    policy = GuardPolicy(require_https=True)
    with pytest.raises(InvalidURL, match="https"):
        guard.check_url("http://example.com/", policy, Fixed("93.184.216.34"))
    assert guard.check_url("https://example.com/", policy, Fixed("93.184.216.34"))[1] == 443
