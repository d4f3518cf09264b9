"""0009_attempt_intents: attempt intents kept until their attempt is recorded
(attempt_intents); the lost ones are written to delivery_attempts by the sink.

Executes postbacks/db/migrations/0009_attempt_intents.sql, the single source of this
revision's DDL.

Revision ID: 0009_attempt_intents
Revises: 0008_suppressions_resolve
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0009_attempt_intents'
down_revision = '0008_suppressions_resolve'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
