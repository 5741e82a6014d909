"""The secret box: a passphrase is stretched into its key, and tokens made under the first
derivation (one SHA-256) still open."""

from __future__ import annotations

import pytest

from app.crypto import SecretBox, _legacy


def test_a_passphrase_is_stretched_not_hashed_once():
    box = SecretBox(["correct horse battery staple"])
    token = box.encrypt("whsec_x")
    with pytest.raises(ValueError, match="cannot be decrypted"):
        SecretBox([_legacy_key_only("correct horse battery staple")]).decrypt(token)
    assert box.decrypt(_legacy("correct horse battery staple").encrypt(b"old").decode()) == "old"


def _legacy_key_only(passphrase: str) -> str:
    import base64
    import hashlib

    return base64.urlsafe_b64encode(hashlib.sha256(passphrase.encode()).digest()).decode()
