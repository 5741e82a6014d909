"""The one rule for URLs the workers call (`app.net.urls.check_outbound_url`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import Settings
from app.errors import ValidationFailed
from app.net import guard
from app.net.urls import MAX_URL_LENGTH, check_outbound_url


def public(_host: str, _port: int) -> list[str]:
    return ["93.184.216.34"]


def internal(_host: str, _port: int) -> list[str]:
    return ["169.254.169.254"]


def unresolvable(host: str, _port: int) -> list[str]:
    raise guard.ResolutionError(f"{host} does not resolve")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


def refusal(
    value: object, settings: Settings, resolver: guard.Resolver = public
) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as refused:
        check_outbound_url(value, "hook", settings, resolver)
    return refused.value


def test_a_public_url_passes_and_an_unresolved_one_is_left_to_send_time(settings) -> None:
    assert (
        check_outbound_url("https://example.com/x", "hook", settings, public)
        == "https://example.com/x"
    )
    assert check_outbound_url("https://later.example/x", "hook", settings, unresolvable)


def test_the_limit_is_2048_characters(settings) -> None:
    base = "https://example.com/?pad="
    longest = base + "x" * (MAX_URL_LENGTH - len(base))
    assert MAX_URL_LENGTH == 2048
    assert check_outbound_url(longest, "hook", settings, public) == longest
    error = refusal(longest + "x", settings)
    assert (error.code, error.details) == ("invalid_url", {"field": "hook"})


def test_credentials_in_the_url_are_refused(settings) -> None:
    error = refusal("https://user:pw@example.com/", settings)
    assert (error.code, error.details) == ("invalid_url", {"field": "hook", "reason": "userinfo"})
    assert error.status == 422 and "hook must not carry credentials" in error.message


@pytest.mark.parametrize("value", [None, "", 5, "gopher://example.com/", "http://"])
def test_what_is_not_an_http_url_is_invalid(settings, value: object) -> None:
    assert refusal(value, settings).code == "invalid_url"


def test_an_internal_target_is_a_blocked_address(settings) -> None:
    error = refusal("https://metadata.example/", settings, internal)
    assert error.code == "blocked_address" and error.details["field"] == "hook"
