"""0007_console_search: indexes for the console's search and dead-letter filters.

Executes postbacks/db/migrations/0007_console_search.sql, the single source of this revision's DDL.

Revision ID: 0007_console_search
Revises: 0006_console_tokens
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0007_console_search'
down_revision = '0006_console_tokens'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
