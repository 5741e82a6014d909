"""The master key (KURIR_SECRET_KEY) is rotated by `kurir secrets reencrypt`: every stored
secret moves under the newest key, secrets from the first passphrase derivation included."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner
from sqlalchemy import select

from app.cli import cli
from app.crypto import SecretBox, _legacy
from app.models import EndpointSecret
from tests.support.publish import contract_and_partner, make_endpoint


def _env(settings: Any) -> dict[str, str]:
    return {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }


def test_secrets_reencrypt_moves_every_secret_to_the_newest_key(client, auth, settings, runtime):
    """Rotating KURIR_SECRET_KEY: new key first, re-encrypt, drop the old one. Secrets made
    under the first passphrase derivation (one SHA-256) are moved too."""
    contract_and_partner(client, auth)
    ep = make_endpoint(client, auth)
    with runtime.db.begin() as session:
        legacy_row = session.scalar(select(EndpointSecret))
        plain = runtime.secret_box.decrypt(legacy_row.secret_encrypted)
        legacy_row.secret_encrypted = _legacy(settings.secret_key).encrypt(plain.encode()).decode()
    new_key = "a brand new master passphrase"
    env = {**_env(settings), "KURIR_SECRET_KEY": f"{new_key},{settings.secret_key}"}
    result = CliRunner().invoke(cli, ["secrets", "reencrypt"], env=env)
    assert result.exit_code == 0, result.output
    assert "re-encrypted 1 of 1" in result.stdout
    newest_only = SecretBox([new_key])
    with runtime.db.begin() as session:
        stored = session.scalar(select(EndpointSecret.secret_encrypted))
    assert newest_only.decrypt(stored) == plain == ep["secret"]
    again = CliRunner().invoke(cli, ["secrets", "reencrypt"], env=env)
    assert "re-encrypted 0 of 1" in again.stdout
