"""0008_suppressions_resolve: resolving a suppression (resolved_at, resolved_by).

Executes postbacks/db/migrations/0008_suppressions_resolve.sql, the single source of this
revision's DDL.

Revision ID: 0008_suppressions_resolve
Revises: 0007_console_search
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0008_suppressions_resolve'
down_revision = '0007_console_search'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
