"""Exceptions, grouped by what the caller does next.

::

    PostbacksError
    ├── ConfigError            fix configuration; the process exits non-zero at start
    ├── ServiceUnavailable     a broker or database is missing; exit with how to start it
    └── DeadLetterError        this input can never succeed: send it to the DLQ and go on
        ├── UndecodableRecord  bytes that are not a known Avro record (original bytes kept)
        └── InvalidRecord      decodes, but a required field is missing or empty

Third-party exceptions (confluent_kafka, psycopg, aiohttp, fastavro) are translated into
these at the adapter that calls the library.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DeadLetterError",
    "InvalidRecord",
    "PostbacksError",
    "ServiceUnavailable",
    "UndecodableRecord",
]


class PostbacksError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(PostbacksError):
    """A setting or endpoint configuration is wrong; a person must fix it."""


class ServiceUnavailable(PostbacksError):
    """Kafka or PostgreSQL cannot be reached."""


class DeadLetterError(PostbacksError):
    """The input can never be processed; it belongs on the dead-letter topic."""

    reason: str = "dead_letter"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class UndecodableRecord(DeadLetterError):
    reason = "undecodable"


class InvalidRecord(DeadLetterError):
    reason = "invalid_record"
