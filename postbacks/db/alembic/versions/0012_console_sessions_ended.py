"""0012_console_sessions_ended: signing out of the console ends the session on the server
(a signed-out cookie is refused until it would have expired).

Executes postbacks/db/migrations/0012_console_sessions_ended.sql, the single source of
this revision's DDL.

Revision ID: 0012_console_sessions_ended
Revises: 0011_replay_items_outcome
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0012_console_sessions_ended'
down_revision = '0011_replay_items_outcome'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
