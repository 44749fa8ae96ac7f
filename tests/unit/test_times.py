"""The one grammar of times and durations a user types (kombu_ladder.times): a table, and its users share it."""

from __future__ import annotations

from datetime import datetime, timezone

import click
import pytest

from kombu_ladder.times import TIME_HELP, parse_when, read_duration, read_time

NOW = 1_796_180_400_000  # 2026-12-02T03:00Z

TIMES = [
    ("90", 90.0), ("0", 0.0), ("0.5", 0.5), ("-30", -30.0), (" +90 ", 90.0),
    ("+10m", 600.0), ("10m", 600.0), ("-30s", -30.0), ("1.5s", 1.5), ("2h30m", 9000.0), ("1d", 86400.0),
    ("-1d2h", -93600.0),
    ("2026-12-02T03:00", datetime(2026, 12, 2, 3, tzinfo=timezone.utc)),
    ("2026-12-02T03:00Z", datetime(2026, 12, 2, 3, tzinfo=timezone.utc)),
    ("2026-12-02T03:00:00.250z", datetime(2026, 12, 2, 3, 0, 0, 250000, tzinfo=timezone.utc)),
    ("2026-12-02T04:00+01:00", datetime(2026, 12, 2, 3, tzinfo=timezone.utc)),
]
NOT_TIMES = ["", "tomorrow", "2h30", "+h", "1e3", "nan", "inf", "10w", "2026-13-01", "+-5", "--5", "5 m s"]


@pytest.mark.parametrize("given,expected", TIMES)
def test_a_time_is_seconds_or_a_duration_from_now_or_iso_8601_in_utc_without_offset(given: str,
                                                                                   expected: object) -> None:
    assert read_time(given) == expected
    moment = read_time(given)
    if isinstance(moment, datetime):
        assert moment.tzinfo is not None, "every moment is aware: a time without an offset is UTC"
        assert parse_when(given, option="--x", now_ms=NOW) == round(moment.timestamp() * 1000)
    else:
        assert parse_when(given, option="--x", now_ms=NOW) == NOW + round(moment * 1000)


@pytest.mark.parametrize("given", NOT_TIMES)
def test_anything_else_is_refused_naming_the_argument_and_the_grammar(given: str) -> None:
    with pytest.raises(ValueError, match="^--due-after: ") as caught:
        parse_when(given, option="--due-after", now_ms=NOW)
    assert TIME_HELP in str(caught.value)


@pytest.mark.parametrize("given,expected", [("90", 90.0), ("0.5", 0.5), ("10m", 600.0), ("2h30m", 9000.0),
                                            (" 1d ", 86400.0)])
def test_a_duration_is_seconds_or_units(given: str, expected: float) -> None:
    assert read_duration(given) == expected


@pytest.mark.parametrize("given", ["", "+10m", "-30", "soon", "2h30", "1e400"])
def test_a_duration_has_no_sign_and_no_other_form(given: str) -> None:
    with pytest.raises(ValueError, match="^ladder_hold_window: "):
        read_duration(given, argument="ladder_hold_window")


@pytest.mark.parametrize("given", [g for g, _ in TIMES] + NOT_TIMES)
def test_the_console_and_the_command_lines_accept_exactly_the_same_strings(given: str) -> None:
    """The console's reschedule form, the CLI's WHEN and its --due-before read one grammar."""
    from kombu_ladder.cli import options, waiting
    from kombu_ladder.web.app import _when

    def accepted(read: object) -> bool:
        try:
            read()  # type: ignore[operator]
        except (ValueError, click.BadParameter):
            return False
        return True

    console = accepted(lambda: _when(given, NOW))
    assert accepted(lambda: waiting.When().convert(given, None, None)) is console
    # reschedule's WHEN also refuses a time past max_delay: none in this table is
    assert accepted(lambda: options.When().convert(given, None, None)) is console
    assert console is (given in dict(TIMES))
