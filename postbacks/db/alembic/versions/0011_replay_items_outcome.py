"""0011_replay_items_outcome: the id of the `replayed` outcome each replay item published,
and replay items found by delivery id (a replay in flight until the sink records it).

Executes postbacks/db/migrations/0011_replay_items_outcome.sql, the single source of
this revision's DDL.

Revision ID: 0011_replay_items_outcome
Revises: 0010_deliveries_partitioned
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0011_replay_items_outcome'
down_revision = '0010_deliveries_partitioned'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
