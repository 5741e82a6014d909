"""Configuration parsing: defaults that work, and invalid values that fail loudly at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import DEFAULT_RETRY_SCHEDULE, ENV_VARS, ConfigError, load_settings
from app.db import prepare_threshold_of


def test_defaults_need_no_environment() -> None:
    settings = load_settings({})
    assert settings.data_dir == Path("var")
    assert settings.max_payload_bytes == 256 * 1024
    assert settings.retry_schedule == DEFAULT_RETRY_SCHEDULE
    assert len(settings.retry_schedule) + 1 == 13  # first try + 12 retries
    assert settings.disable_after_failures == 8
    assert settings.disable_after_seconds == 86400
    assert settings.secret_rotation_overlap_seconds == 86400
    assert settings.allow_private_targets is False
    assert settings.resolved_database_url.startswith("sqlite:///")
    assert settings.resolved_database_url.endswith("var/kurir.db")


def test_every_variable_is_read() -> None:
    env = {
        "KURIR_DATA_DIR": "/srv/kurir",
        "DATABASE_URL": "postgres://u:p@db:5432/kurir",
        "KURIR_SECRET_KEY": "a long shared passphrase",
        "KURIR_INBOUND_HANDLERS": "on_paid=billing.hooks:on_paid, audit=billing.audit:log",
        "KURIR_TRUSTED_PROXIES": "10.0.0.0/8,192.168.1.5",
        "KURIR_COOKIE_SECURE": "0",
        "REDIS_URL": "redis://cache:6379/1",
        "KURIR_MAX_PAYLOAD_BYTES": "4096",
        "KURIR_RETRY_SCHEDULE": "1, 2,3",
        "KURIR_DISABLE_AFTER_FAILURES": "3",
        "KURIR_DISABLE_AFTER_SECONDS": "60",
        "KURIR_ALLOW_PRIVATE_TARGETS": "1",
        "KURIR_ALLOWED_CIDRS": "10.0.0.0/8,fd00::/8",
        "KURIR_REQUIRE_HTTPS": "true",
        "KURIR_SECRET_ROTATION_OVERLAP_SECONDS": "10",
        "KURIR_RECONCILE_CRON": "*/5 * * * *",
        "KURIR_LOG_FORMAT": "json",
        "KURIR_HTTP_SERVER": "Gunicorn",
    }
    settings = load_settings(env)
    assert settings.data_dir == Path("/srv/kurir")
    assert settings.resolved_database_url == "postgresql+psycopg://u:p@db:5432/kurir"
    assert settings.resolved_redis_url == "redis://cache:6379/1"
    assert settings.max_payload_bytes == 4096
    assert settings.retry_schedule == (1, 2, 3)
    assert settings.disable_after_failures == 3
    assert settings.disable_after_seconds == 60
    assert settings.allow_private_targets is True
    assert settings.allowed_cidrs == ("10.0.0.0/8", "fd00::/8")
    assert settings.require_https is True
    assert settings.secret_rotation_overlap_seconds == 10
    assert settings.reconcile_cron == "*/5 * * * *"
    assert settings.log_format == "json"
    assert settings.http_server == "gunicorn"
    assert settings.handler_registry == {
        "on_paid": "billing.hooks:on_paid",
        "audit": "billing.audit:log",
    }
    assert settings.trusted_proxies == ("10.0.0.0/8", "192.168.1.5")
    assert settings.cookie_secure is False


def test_trusted_proxies_is_a_hop_count_or_networks_and_cookie_secure_defaults_to_auto() -> None:
    assert load_settings({}).trusted_proxies == 0
    assert load_settings({}).cookie_secure is None
    assert load_settings({"KURIR_TRUSTED_PROXIES": "2"}).trusted_proxies == 2
    assert load_settings({"KURIR_COOKIE_SECURE": "auto"}).cookie_secure is None
    assert load_settings({"KURIR_COOKIE_SECURE": "1"}).cookie_secure is True


def test_postgresql_without_a_secret_key_is_refused_naming_the_variable() -> None:
    """Separate processes would each invent a development key and fail to decrypt each
    other's secrets: a deployment must share one."""
    with pytest.raises(ConfigError, match="KURIR_SECRET_KEY"):
        load_settings({"DATABASE_URL": "postgresql://u@db/kurir"})
    assert (
        load_settings(
            {"DATABASE_URL": "postgresql://u@db/kurir", "KURIR_SECRET_KEY": "k"}
        ).secret_key
        == "k"
    )
    assert load_settings({}).secret_key is None  # the embedded default makes its own


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("KURIR_MAX_PAYLOAD_BYTES", "lots"),
        ("KURIR_MAX_PAYLOAD_BYTES", "-1"),
        ("KURIR_RETRY_SCHEDULE", ""),
        ("KURIR_RETRY_SCHEDULE", "5,x,10"),
        ("KURIR_RETRY_SCHEDULE", "5,-1"),
        ("KURIR_DISABLE_AFTER_FAILURES", "0"),
        ("KURIR_ALLOW_PRIVATE_TARGETS", "maybe"),
        ("KURIR_ALLOWED_CIDRS", "10.0.0.0/33"),
        ("KURIR_RECONCILE_CRON", "nightly"),
        ("KURIR_RECONCILE_CRON", "99 * * * *"),
        ("KURIR_LOG_FORMAT", "xml"),
        ("KURIR_HTTP_SERVER", "uwsgi"),
        ("KURIR_DEFAULT_TIMEOUT_S", "31"),
        ("DATABASE_URL", "mysql://localhost/kurir"),
        ("DATABASE_URL", "postgresql://u@db/kurir?prepare_threshold=never"),
        ("REDIS_URL", "http://localhost:6379"),
        ("REDIS_URL", "redis+sentinel://s1:26379,s2:26379"),
        ("REDIS_URL", "redis+sentinel:///kurir"),
        ("REDIS_URL", "redis+sentinel://s1:26379,,s2/kurir"),
        ("REDIS_URL", "redis+sentinel://s1:port/kurir"),
        ("REDIS_URL", "redis+sentinel://s1:70000/kurir"),
        ("REDIS_URL", "redis+sentinel://s1/kurir/zero"),
        ("REDIS_URL", "redis+sentinel://s1/kurir/0/extra"),
        ("REDIS_URL", "redis+sentinel://s1/kurir?ssl=1"),
        ("REDIS_URL", "redis+sentinel://[::1/kurir"),
        ("KURIR_INBOUND_HANDLERS", "os:system"),
        ("KURIR_INBOUND_HANDLERS", "x=not a path"),
        ("KURIR_TRUSTED_PROXIES", "10.0.0.0/33"),
        ("KURIR_COOKIE_SECURE", "sometimes"),
    ],
)
def test_invalid_value_names_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        load_settings({var: value})


def test_a_bad_redis_url_is_reported_without_its_password() -> None:
    with pytest.raises(ConfigError, match="REDIS_URL") as caught:
        load_settings({"REDIS_URL": "redis+sentinel://kurir:hunter2@s1:26379"})
    assert "hunter2" not in str(caught.value)
    assert "names no master" in str(caught.value)


def test_sentinel_redis_urls_are_accepted() -> None:
    for url in (
        "redis+sentinel://s1:26379,s2:26379,s3:26379/kurir",
        "redis+sentinel://:secret@s1,[::1]:26380/kurir/2",
        "rediss+sentinel://user:secret@s1:26379/kurir/0",
    ):
        assert load_settings({"REDIS_URL": url}).resolved_redis_url == url


def test_env_vars_are_all_documented_in_the_configuration_page() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [var for var in ENV_VARS if f"`{var}`" not in readme]
    assert missing == []


def test_redis_url_falls_back_to_embedded_server_file(tmp_path: Path) -> None:
    (tmp_path / "redis.url").write_text("unix:///tmp/x.sock\n")
    settings = load_settings({"KURIR_DATA_DIR": str(tmp_path)})
    assert settings.resolved_redis_url == "unix:///tmp/x.sock"
    assert load_settings({"KURIR_DATA_DIR": str(tmp_path / "none")}).resolved_redis_url == (
        "redis://127.0.0.1:6379/0"
    )


def test_portal_settings_are_read_and_frame_ancestors_cannot_end_the_directive() -> None:
    defaults = load_settings({})
    assert (defaults.portal_title, defaults.portal_frame_ancestors) == ("Webhooks", "'none'")
    assert defaults.portal_framable is False and defaults.public_url is None
    settings = load_settings(
        {
            "KURIR_PORTAL_TITLE": "Acme webhooks",
            "KURIR_PORTAL_FRAME_ANCESTORS": "https://app.example.com  https://*.example.org:8443",
            "KURIR_PORTAL_LINK_TTL_SECONDS": "3600",
            "KURIR_PUBLIC_URL": "https://hooks.example.com/",
        }
    )
    assert settings.portal_title == "Acme webhooks"
    assert settings.portal_frame_ancestors == "https://app.example.com https://*.example.org:8443"
    assert settings.portal_framable is True
    assert settings.portal_link_ttl_seconds == 3600
    assert settings.public_url == "https://hooks.example.com"
    for bad in (
        "https://a.example; script-src *",
        "'none' https://a.example",
        "https://a.example,https://b.example",
        "",
    ):
        with pytest.raises(ConfigError, match="KURIR_PORTAL_FRAME_ANCESTORS"):
            load_settings({"KURIR_PORTAL_FRAME_ANCESTORS": bad})
    with pytest.raises(ConfigError, match="KURIR_PORTAL_LINK_TTL_SECONDS"):
        load_settings({"KURIR_PORTAL_LINK_TTL_SECONDS": "90000"})
    with pytest.raises(ConfigError, match="KURIR_PUBLIC_URL"):
        load_settings({"KURIR_PUBLIC_URL": "hooks.example.com"})


def test_the_scheduler_lease_follows_the_sweep_interval_unless_set() -> None:
    """Takeover within two sweep intervals: lease 1.5 × the sweep interval, renewed six times
    per lease; set explicitly, the renewal must leave the holder three tries per lease."""
    default = load_settings({})
    assert default.resolved_scheduler_lease_seconds == 3.0
    assert default.resolved_scheduler_renew_seconds == 0.5
    slow = load_settings({"KURIR_SWEEP_INTERVAL_SECONDS": "10"})
    assert slow.resolved_scheduler_lease_seconds == 15.0
    assert slow.resolved_scheduler_renew_seconds == 2.5
    set_ = load_settings(
        {"KURIR_SCHEDULER_LEASE_SECONDS": "6", "KURIR_SCHEDULER_RENEW_SECONDS": "2"}
    )
    assert (set_.resolved_scheduler_lease_seconds, set_.resolved_scheduler_renew_seconds) == (
        6.0,
        2.0,
    )
    with pytest.raises(ConfigError, match="KURIR_SCHEDULER_RENEW_SECONDS"):
        load_settings({"KURIR_SCHEDULER_RENEW_SECONDS": "1.5"})  # lease 3 s: too few tries


@pytest.mark.parametrize(
    ("query", "connect_args"),
    [
        ("", {}),
        ("?prepare_threshold=none", {"prepare_threshold": None}),
        ("?prepare_threshold=0", {"prepare_threshold": 0}),
        ("?sslmode=require&prepare_threshold=NONE", {"prepare_threshold": None}),
    ],
)
def test_prepare_threshold_is_taken_off_the_url_for_psycopg(
    query: str, connect_args: dict[str, object]
) -> None:
    url, args = prepare_threshold_of(f"postgresql+psycopg://u:p%40ss@db:6432/kurir{query}")
    assert args == connect_args
    assert "prepare_threshold" not in url.query
    assert (url.password, url.port, url.database) == ("p@ss", 6432, "kurir")
    assert url.query.get("sslmode") == ("require" if "sslmode" in query else None)


def test_a_pooled_url_is_accepted_as_it_is() -> None:
    url = "postgres://u@pgbouncer:6432/kurir?prepare_threshold=none"
    settings = load_settings({"DATABASE_URL": url, "KURIR_SECRET_KEY": "k"})
    assert settings.resolved_database_url.endswith("?prepare_threshold=none")
