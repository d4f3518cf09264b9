"""Encryption at rest for endpoint signing secrets (AES-256-GCM, random 96-bit nonce)."""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from postbacks.errors import ConfigError

__all__ = ["SecretBox"]


class SecretBox:
    def __init__(self, key_b64: str) -> None:
        try:
            key = base64.b64decode(key_b64, validate=True)
        except ValueError as exc:
            raise ConfigError("POSTBACKS_SECRETS_KEY must be base64") from exc
        if len(key) != 32:
            raise ConfigError("POSTBACKS_SECRETS_KEY must decode to 32 bytes")
        self._aead = AESGCM(key)

    def seal(self, plaintext: str, associated: str) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, plaintext.encode(), associated.encode())

    def open(self, sealed: bytes, associated: str) -> str:
        try:
            return self._aead.decrypt(sealed[:12], sealed[12:], associated.encode()).decode()
        except InvalidTag as exc:
            raise ConfigError(
                f"cannot decrypt secret for {associated}: wrong POSTBACKS_SECRETS_KEY?"
            ) from exc
