"""Tracing's switch and its no-op: off unless asked for, harmless without the extra.

`configure` installs a global tracer provider, which a process may do only once, so every
case that turns tracing on runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app import telemetry
from app.config import ConfigError, Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter at the repository root with only `env` set."""
    return subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"KURIR_OTEL": "1"}, True),
        ({"KURIR_OTEL": "auto"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "KURIR_OTEL": "0"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
    ],
)
def test_tracing_is_off_unless_kurir_otel_or_an_otlp_endpoint_asks_for_it(env, on) -> None:
    assert load_settings(env).tracing is on


def test_an_unknown_traces_exporter_stops_the_start() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        load_settings({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_while_off_every_call_is_a_no_op() -> None:
    assert not telemetry.enabled()
    assert not telemetry.configure(Settings())
    with telemetry.span("kurir.publish", parent="00-" + "a" * 32 + "-" + "b" * 16 + "-01") as s:
        assert s is telemetry.NO_SPAN
        s.set_attribute("kurir.event.id", "evt_1")
        assert not s.is_recording()
    started = telemetry.start("kurir.inbound.apply")
    telemetry.end(started, error="failed", attributes={"a": 1})
    telemetry.failed(started, "x")
    assert telemetry.traceparent() is None
    assert telemetry.header_value([("traceparent", "00-x")]) is None


def test_configure_makes_spans_with_the_standard_variables_in_a_fresh_process() -> None:
    pytest.importorskip("opentelemetry.sdk")
    code = (
        "from app import telemetry\n"
        "from app.config import load_settings\n"
        "assert telemetry.configure(load_settings())\n"
        "with telemetry.span('kurir.publish', parent='00-" + "a" * 32 + "-" + "b" * 16 + "-01'):\n"
        "    print('TP', telemetry.traceparent())\n"
    )
    result = _python(code, KURIR_OTEL="1", OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    first, _, exported = result.stdout.partition("\n")
    assert first.startswith("TP 00-" + "a" * 32 + "-")
    span = json.loads(exported)
    assert span["name"] == "kurir.publish"
    assert span["context"]["trace_id"] == "0x" + "a" * 32
    assert span["parent_id"] == "0x" + "b" * 16
    assert span["resource"]["attributes"]["service.name"] == "kurir"

    named = _python(code, KURIR_OTEL="1", OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="hooks")
    assert named.returncode == 0, named.stderr
    assert '"service.name": "hooks"' in named.stdout


def test_without_the_extra_tracing_stays_off_with_a_warning() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if kurir[otel] were not installed\n"
        "from app import telemetry\n"
        "from app.config import load_settings\n"
        "assert not telemetry.configure(load_settings())\n"
        "assert telemetry.span('kurir.publish') is telemetry.NO_SPAN\n"
        "print('still running')\n"
    )
    result = _python(code, OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "still running"
    assert "pip install 'kurir[otel]'" in result.stderr
