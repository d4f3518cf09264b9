"""0003_config_versions: the config change counters.

Executes postbacks/db/migrations/0003_config_versions.sql, the single source of this revision's DDL.

Revision ID: 0003_config_versions
Revises: 0002_console
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0003_config_versions'
down_revision = '0002_console'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
