"""Encryption at rest for signing secrets: a database dump alone must not let anyone forge."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

log = logging.getLogger(__name__)

DEV_KEY_FILE = "secret.key"


def _fernet_for(material: str) -> Fernet:
    """Accept a Fernet key as is, or derive one from any passphrase."""
    try:
        return Fernet(material.encode())
    except (ValueError, TypeError):
        digest = hashlib.sha256(material.encode()).digest()
        return Fernet(base64.urlsafe_b64encode(digest))


class SecretBox:
    """Encrypts secrets with the current key, decrypts with the current or any previous one.

    KURIR_SECRET_KEY may hold several keys separated by commas (newest first) so the master key
    itself can be rotated without re-encrypting everything at once.
    """

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise ValueError("at least one key is needed")
        self._fernet = MultiFernet([_fernet_for(k) for k in keys])

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ValueError("secret cannot be decrypted with KURIR_SECRET_KEY") from None


def load_secret_box(secret_key: str | None, data_dir: Path) -> SecretBox:
    """The box for KURIR_SECRET_KEY, or for a dev key generated once into the data dir."""
    if secret_key:
        return SecretBox([k.strip() for k in secret_key.split(",") if k.strip()])
    path = data_dir / DEV_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(Fernet.generate_key())
        try:
            # link() fails if another process won the race: then everyone uses the winner's key.
            os.link(tmp, path)
            log.warning("KURIR_SECRET_KEY is unset: generated a development key in the data dir")
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return SecretBox([path.read_text().strip()])
