"""The addresses of the services ``deploy/local/services.sh`` runs, for the demo that
starts them: the script's ``env`` (its ports follow ``POSTBACKS_KAFKA_PORT`` and
``POSTBACKS_PG_PORT``), unless the caller named the broker or the database itself."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

from postbacks.settings import Settings

__all__ = ["script_addresses", "with_script_addresses"]

def script_addresses(script: Path) -> dict[str, str]:
    """The ``export NAME=value`` lines of ``bash <script> env``."""
    out = subprocess.run(["bash", str(script), "env"], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            found[name] = value
    return found


def with_script_addresses(settings: Settings, script: Path,
                          env: Mapping[str, str] | None = None) -> Settings:
    """``settings`` with the broker and database the script started, for each of the two
    that ``env`` (default ``os.environ``) does not set."""
    env = os.environ if env is None else env
    found = script_addresses(script)
    kafka, db = (found.get(name) if not env.get(name) else None
                 for name in ("KAFKA_BOOTSTRAP_SERVERS", "POSTBACKS_DATABASE_URL"))
    if kafka:
        settings = dataclasses.replace(settings, kafka_bootstrap_servers=kafka)
    if db:
        settings = dataclasses.replace(settings, database_url=db)
    return settings
