"""0002_console: the replay console: tokens, replay jobs and items, keyset-paging indexes.

Executes postbacks/db/migrations/0002_console.sql, the single source of this revision's DDL.

Revision ID: 0002_console
Revises: 0001_init
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0002_console'
down_revision = '0001_init'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
