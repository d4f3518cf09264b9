"""0004_endpoint_health: endpoint health and auto-disable.

Executes postbacks/db/migrations/0004_endpoint_health.sql, the single source of this revision's DDL.

Revision ID: 0004_endpoint_health
Revises: 0003_config_versions
"""

from __future__ import annotations

from postbacks.db.migrate import run_sql_file

revision = '0004_endpoint_health'
down_revision = '0003_config_versions'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file(revision)


def downgrade() -> None:
    raise NotImplementedError("the schema is forward-only: restore a backup to go back")
