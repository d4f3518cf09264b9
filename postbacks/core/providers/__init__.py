"""Outbound hook providers: a registry of self-registering :class:`Provider` classes.

``endpoints.provider`` is a key of this registry (validated on save). Importing this
package registers the built-in providers:

* ``v3`` — POST of the canonical, versioned JSON envelope (Standard Webhooks signed)
* ``v2`` — GET with ``{macro}`` URL templates (Standard Webhooks signed, empty body)
* ``partner`` — form-encoded POST with a partner-specific HMAC signature

Adding a provider: subclass :class:`Provider` in a new module, call ``register(...)``
at its bottom, and import the module here.
"""

from __future__ import annotations

from postbacks.core.providers import partner, v2, v3
from postbacks.core.providers.base import (
    Provider,
    RenderedRequest,
    RenderError,
    get_provider,
    provider_names,
    register,
)

__all__ = [
    "Provider",
    "RenderError",
    "RenderedRequest",
    "get_provider",
    "partner",
    "provider_names",
    "register",
    "v2",
    "v3",
]
