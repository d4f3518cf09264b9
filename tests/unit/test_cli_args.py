"""Bad option values are argparse's one-line error naming the option, exit 2: nan and inf,
ports out of range, counts below one (they were tracebacks, or exit 0 doing nothing)."""

from __future__ import annotations

import pytest

from postbacks.cli import build_parser


@pytest.mark.parametrize(("argv", "words"), [
    (["emit", "--apps", "0"], "argument --apps: '0' is not a whole number of at least 1"),
    (["emit", "--count", "-5"], "argument --count: '-5' is not a whole number"),
    (["emit", "--rate", "nan"], "argument --rate: 'nan' is not a finite number"),
    (["receiver", "--port", "99999"], "argument --port: '99999' is not a port"),
    (["gaps", "--limit", "-1"], "argument --limit: '-1' is not a whole number from 1"),
    (["retention", "--keep-days", "1"], "argument --keep-days"),
    (["anomaly", "set-mode", "--scope", "global", "--detector", "value_rate", "--mode",
      "detect", "--floor-usd", "nan"], "argument --floor-usd: 'nan' is not a finite number"),
    (["anomaly", "set-mode", "--scope", "global", "--detector", "retrodating", "--mode",
      "detect", "--window-days", "inf"], "argument --window-days: 'inf'"),
    (["console", "serve", "--port", "-1"], "argument --port: '-1' is not a port"),
    (["deliveries", "list", "--limit", "500"], "argument --limit: '500' is not a whole number"),
    (["anomaly", "set-mode", "--scope", "global", "--detector", "retrodating", "--mode",
      "detect", "--burst-count", "-1"], "argument --burst-count: '-1' is not a whole number"),
])
def test_bad_values_are_named_usage_errors(argv: list[str], words: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_good_values_parse() -> None:
    args = build_parser().parse_args(["emit", "--apps", "3", "--count", "10", "--rate", "2.5"])
    assert (args.apps, args.count, args.rate) == (3, 10, 2.5)
    off = build_parser().parse_args(["anomaly", "set-mode", "--scope", "global", "--detector",
                                     "retrodating", "--mode", "detect", "--burst-count", "0",
                                     "--actor", "a"])
    assert off.burst_count == 0  # 0 turns the burst off (docs/containment.md)
