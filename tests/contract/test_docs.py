"""The docs describe the product as it is: every setting has its row, every command in the
README exists, the README stays short, and no page narrates development history."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from postbacks.cli import build_parser
from postbacks.settings import Settings, env_name

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_setting_is_in_the_operators_reference() -> None:
    text = (ROOT / "docs/operators.md").read_text()
    names = [env_name(f.name) for f in dataclasses.fields(Settings)]
    assert [n for n in names if f"`{n}`" not in text] == []


def test_the_readme_stays_under_15_kb() -> None:
    assert (ROOT / "README.md").stat().st_size < 15_000


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_narrates_development_history(path: Path) -> None:
    hits = [line for line in path.read_text().splitlines()
            if re.search(r"\bstop[ -]?\d+|\bthis stop\b|\blast run\b", line, re.I)]
    assert hits == []


def test_the_postbacks_commands_the_readme_names_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"(?:`|\n)(?:\.venv/bin/)?postbacks ([a-z][a-z-]+)", readme))
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert named, "the README names no command"
    assert named - commands == set()
