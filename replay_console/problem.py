"""The console's one error for a request it answers with a status and a message (4xx).

Raised anywhere below the middleware (:mod:`replay_console.web`), which renders it as the
API's JSON problem or an error page; nothing it carries is ever an internal detail.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Problem"]


class Problem(Exception):
    """An error the page and the API show as is."""

    def __init__(self, status: int, message: str, *, audit: bool = False,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.audit = audit  # audited as a refusal, as every 403 and 429 is
        self.extra = extra
