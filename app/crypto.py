"""Encryption at rest for signing secrets: a database dump alone must not let anyone forge."""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

log = logging.getLogger(__name__)

DEV_KEY_FILE = "secret.key"


# A passphrase is stretched with scrypt (~30 MiB, a few tens of ms, once per process) so a
# leaked database cannot be decrypted by guessing it at hash speed. The salt is fixed: it
# separates Kurir's keys from other uses of the passphrase; guessing cost comes from the KDF.
KDF_SALT = b"kurir/secret-key/scrypt-v1"
KDF_N, KDF_R, KDF_P = 2**15, 8, 1
KDF_MAXMEM = 64 * 1024 * 1024


def _is_fernet_key(material: str) -> bool:
    try:
        Fernet(material.encode())
    except (ValueError, TypeError):
        return False
    return True


@functools.lru_cache(maxsize=16)
def _stretched(passphrase: str) -> Fernet:
    key = hashlib.scrypt(
        passphrase.encode(), salt=KDF_SALT, n=KDF_N, r=KDF_R, p=KDF_P, maxmem=KDF_MAXMEM, dklen=32
    )
    return Fernet(base64.urlsafe_b64encode(key))


def _legacy(passphrase: str) -> Fernet:
    """The first derivation (one SHA-256): kept to read what it encrypted, never to write."""
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(passphrase.encode()).digest()))


def _fernets_for(keys: list[str]) -> list[Fernet]:
    """Newest key first, then the older keys; the legacy derivations of passphrases last."""
    current = [Fernet(k.encode()) if _is_fernet_key(k) else _stretched(k) for k in keys]
    legacy = [_legacy(k) for k in keys if not _is_fernet_key(k)]
    return current + legacy


class SecretBox:
    """Encrypts secrets with the current key, decrypts with the current or any previous one.

    KURIR_SECRET_KEY may hold several keys separated by commas (newest first) so the master key
    itself can be rotated without re-encrypting everything at once; `kurir secrets reencrypt`
    then moves every stored secret to the newest key (and off the legacy derivation).
    """

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise ValueError("at least one key is needed")
        self._newest = _fernets_for(keys[:1])[0]
        self._fernet = MultiFernet(_fernets_for(keys))

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ValueError("secret cannot be decrypted with KURIR_SECRET_KEY") from None

    def is_current(self, token: str) -> bool:
        """Whether `token` is already encrypted under the newest key's current derivation."""
        try:
            self._newest.decrypt(token.encode())
        except InvalidToken:
            return False
        return True

    def reencrypt(self, token: str) -> str:
        """The same secret, encrypted under the newest key.

        Raises:
            ValueError: no configured key decrypts it.
        """
        return self.encrypt(self.decrypt(token))


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
