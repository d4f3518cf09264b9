"""0010_deliveries_partitioned: deliveries partitioned by day of creation, one row per
delivery held by delivery_keys; the stored rows are moved.

Executes postbacks/db/migrations/0010_deliveries_partitioned.sql, the single source of
this revision's DDL.

Revision ID: 0010_deliveries_partitioned
Revises: 0009_attempt_intents
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0010_deliveries_partitioned'
down_revision = '0009_attempt_intents'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
