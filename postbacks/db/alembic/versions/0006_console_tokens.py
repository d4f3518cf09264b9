"""0006_console_tokens: console token expiry and last use, single-use URL-change confirmations.

Executes postbacks/db/migrations/0006_console_tokens.sql, the single source of this revision's DDL.

Revision ID: 0006_console_tokens
Revises: 0005_notifications
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0006_console_tokens'
down_revision = '0005_notifications'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
