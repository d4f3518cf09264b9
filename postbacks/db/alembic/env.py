"""Alembic's environment for the postbacks schema.

Run by :func:`postbacks.db.migrate.migrate` with the connection it holds under the
migration advisory lock, passed in
``config.attributes["connection"]``; with a ``sqlalchemy.url`` main option instead (the
``alembic`` command line) it opens its own. Each revision runs in its own transaction,
with its row in ``alembic_version``. Revisions execute raw SQL against a live database, so
there is no offline (``--sql``) mode.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo
from sqlalchemy import Connection, create_engine, pool

config = context.config


def _run(connection: Connection) -> None:
    applied: list[str] | None = config.attributes.get("applied")

    def record(ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any],
               run_args: Mapping[str, Any]) -> None:
        if applied is not None and step.is_upgrade and not step.is_stamp \
                and step.up_revision_id:
            applied.append(step.up_revision_id)

    context.configure(connection=connection, transaction_per_migration=True,
                      on_version_apply=record)
    with context.begin_transaction():
        context.run_migrations()


def _online() -> None:
    connection: Connection | None = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection: run the migrations with `postbacks migrate`")
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("the postbacks revisions run SQL files against a live database: "
                       "offline (--sql) mode is not supported")
_online()
