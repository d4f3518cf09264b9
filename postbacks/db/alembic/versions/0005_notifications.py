"""0005_notifications: the notifier's (endpoint, kind, hour) slots.

Executes postbacks/db/migrations/0005_notifications.sql, the single source of this revision's DDL.

Revision ID: 0005_notifications
Revises: 0004_endpoint_health
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0005_notifications'
down_revision = '0004_endpoint_health'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
