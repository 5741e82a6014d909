"""The `kurir` command as a user meets it: help everywhere, clear configuration errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import cli

KURIR = str(Path(sys.executable).with_name("kurir"))


def test_help_lists_every_process_and_admin_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("up", "api", "worker", "scheduler", "db", "keys", "operators"):
        assert f"  {name} " in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["up"],
        ["api"],
        ["worker"],
        ["scheduler"],
        ["db", "upgrade"],
        ["keys", "create"],
        ["operators", "create"],
    ],
)
def test_every_command_has_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_invalid_configuration_fails_at_start_with_the_variable_named(tmp_path: Path) -> None:
    result = subprocess.run(
        [KURIR, "db", "upgrade"],
        capture_output=True,
        text=True,
        env={
            "KURIR_RETRY_SCHEDULE": "5,soon",
            "KURIR_DATA_DIR": str(tmp_path),
            "PATH": "/usr/bin:/bin",
        },
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "KURIR_RETRY_SCHEDULE" in result.stderr
    assert "Traceback" not in result.stderr


def test_db_upgrade_creates_the_embedded_sqlite_database(tmp_path: Path) -> None:
    result = subprocess.run(
        [KURIR, "db", "upgrade"],
        capture_output=True,
        text=True,
        env={"KURIR_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "kurir.db").exists()
    key = subprocess.run(
        [KURIR, "keys", "create", "--name", "svc", "--scope", "read"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"KURIR_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
    )
    assert key.returncode == 0, key.stderr
    assert key.stdout.splitlines()[-1].startswith("kurir_")
