"""0013_held_for_review: an index of the held deliveries awaiting review, without those
parked because their endpoint is disabled (the gate's held-depth gauges).

Executes postbacks/db/migrations/0013_held_for_review.sql, the single source of this
revision's DDL.

Revision ID: 0013_held_for_review
Revises: 0012_console_sessions_ended
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0013_held_for_review'
down_revision = '0012_console_sessions_ended'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
