"""0001_init: the initial schema (endpoints and their secrets, deliveries, attempts,
outcomes, dead letters, suppressions, anomaly settings, audit log, sink offsets).

Executes postbacks/db/migrations/0001_init.sql, the single source of this revision's DDL.

Revision ID: 0001_init
Revises: (none)
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0001_init'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
