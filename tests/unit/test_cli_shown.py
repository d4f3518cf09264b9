"""What the operator commands print of outside text (a receiver's answer, a URL, an error)
cannot drive the terminal: control characters print as escapes."""

from __future__ import annotations

import pytest

from postbacks.cli_output import print_table, shown


@pytest.mark.parametrize(("raw", "lines", "printed"), [
    ("plain text", True, "plain text"),
    ("\x1b]52;c;QUJD\x07", True, "\\x1b]52;c;QUJD\\x07"),  # OSC 52: write the clipboard
    ("ok\x1b[1A\x1b[2Kfake", True, "ok\\x1b[1A\\x1b[2Kfake"),  # rewrite the line above
    ("a\rb", True, "a\\x0db"),  # a carriage return overwrites the line
    ("one\ntwo\tthree", True, "one\ntwo\tthree"),  # a multi-line answer stays readable
    ("one\ntwo", False, "one\\x0atwo"),  # one table cell, one line
    ("\x9b31m", True, "\\x9b31m"),  # a C1 control sequence introducer
    ("\x00\x7f", True, "\\x00\\x7f"),
    ("café ✓", True, "café ✓"),
])
def test_shown(raw: str, lines: bool, printed: str) -> None:
    assert shown(raw, lines=lines) == printed


def test_table_cells_are_shown_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["id", "error"], [["dlv_1", "bad\x1b[31m\nred"], ["dlv_2", None]])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "bad\\x1b[31m\\x0ared" in out
    assert len(out.splitlines()) == 3
