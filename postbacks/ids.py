"""Prefixed ids: ``evt_``, ``dlv_``, ``att_``, ``out_``, ``dlq_``, ``ep_``.

Random ids are time-sortable (48-bit millisecond time + 80 random bits, Crockford base32,
like a ULID) so logs and the console list them in order. Derived ids (``dlv_``) are
deterministic hashes: the same identity always yields the same id.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random

__all__ = ["derived_id", "new_id"]

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
# Uniqueness, not secrecy: a process-local generator seeded from the OS (a syscall per id
# cost ~10 µs on the delivery hot path).
_RNG = random.Random(os.urandom(32))


def _b32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


@functools.lru_cache(maxsize=64)
def _time_part(now_ms: int) -> str:
    return _b32(now_ms & ((1 << 50) - 1), 10)


def new_id(prefix: str, now_ms: int, rand: bytes | None = None) -> str:
    """A time-sortable unique id: ``<prefix>_<10 time chars><16 random chars>``.

    The random part is 64 bits in lowercase hex (a subset of the base32 alphabet)."""
    r = int.from_bytes(rand[:8], "big") if rand is not None else _RNG.getrandbits(64)
    return f"{prefix}_{_time_part(now_ms)}{r:016x}"


def derived_id(prefix: str, *parts: str | None) -> str:
    """A deterministic id from identity parts (``None`` and ``""`` are distinct)."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(b"\x00" if p is None else b"\x01" + p.encode())
        h.update(b"\x1f")
    return f"{prefix}_{_b32(int.from_bytes(h.digest(), 'big'), 26)}"
