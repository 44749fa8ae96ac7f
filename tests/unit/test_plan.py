"""Pure tables for the ladder arithmetic: rung choice, hop forecasts, due-at parsing, bad input."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from kombu_ladder import plan

H, M = 3600, 60


@pytest.mark.parametrize(
    "given,expected",
    [
        (-5000, None),
        (0, None),
        (1, None),
        (999, None),
        (1000, 1),
        (9999, 1),
        (10000, 10),
        (59999, 10),
        (60000, 60),
        (599999, 60),
        (600000, 600),
        (3599999, 600),
        (3600000, 3600),
        (10 * 3600000, 3600),
    ],
)
def test_choose_rung(given: int, expected: object) -> None:
    assert plan.choose_rung(given) == expected


@pytest.mark.parametrize(
    "due_at,now_ms,expected",
    [
        (1_000_000, 1_000_000, None),
        (1_000_000, 2_000_000, None),
        (1_000_999, 1_000_000, None),
        (1_001_000, 1_000_000, 1),
        (1_090_000, 1_000_000, 60),
    ],
)
def test_place(due_at: int, now_ms: int, expected: object) -> None:
    assert plan.place(due_at, now_ms) == expected


@pytest.mark.parametrize(
    "given,expected",
    [
        (4 * H, (3600, 3600, 3600, 3600)),
        (90, (60, 10, 10, 10)),
        (59 * M + 59, (600,) * 5 + (60,) * 9 + (10,) * 5 + (1,) * 9),
        (timedelta(minutes=59, seconds=59), (600,) * 5 + (60,) * 9 + (10,) * 5 + (1,) * 9),
        (timedelta(seconds=90), (60, 10, 10, 10)),
        (24 * H, (3600,) * 24),
        (H + 1, (3600, 1)),
        (61, (60, 1)),
        (10, (10,)),
        (1, (1,)),
        (1.5, (1,)),
        (0.999, ()),
        (0, ()),
        (-30, ()),
    ],
)
def test_hops_for(given: object, expected: tuple) -> None:
    assert plan.hops_for(given) == expected


@pytest.mark.parametrize(
    "given,expected",
    [
        (123, 123),
        (1_700_000_000_000, 1_700_000_000_000),
        (0, 0),
        (-5, -5),
        ("123", 123),
        (" 42 ", 42),
        ("+7", 7),
        ("-7", -7),
        (b"123", 123),
        (bytearray(b"99"), 99),
        (True, None),
        (False, None),
        (None, None),
        (1.5, None),
        (2.0, None),
        ("1.5", None),
        ("abc", None),
        ("", None),
        ("   ", None),
        ("12abc", None),
        ("0x10", None),
        ("1e3", None),
        (b"\xff\xfe", None),
        ([123], None),
        ({"x": 1}, None),
        # Ruby's Integer(s, 10) reads ASCII digits only; Python's int() also reads other scripts.
        ("\u0661\u0662\u0663", None),
        ("\uff11\uff12\uff13", None),
    ],
)
def test_parse_due_at(given: object, expected: object) -> None:
    assert plan.parse_due_at(given) == expected


NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"countdown": 0}, 1_700_000_000_000),
        ({"countdown": 90}, 1_700_000_090_000),
        ({"countdown": 1.25}, 1_700_000_001_250),
        ({"countdown": -10}, 1_699_999_990_000),
        ({"countdown": timedelta(hours=4)}, 1_700_014_400_000),
        ({"eta": datetime.fromtimestamp(NOW + 60, timezone.utc)}, 1_700_000_060_000),
        ({"eta": datetime.fromtimestamp(NOW + 60, timezone(timedelta(hours=5)))}, 1_700_000_060_000),
        ({"eta": datetime.fromtimestamp(NOW - 60, timezone.utc)}, 1_699_999_940_000),
    ],
)
def test_due_at_ms(kwargs: dict, expected: int) -> None:
    assert plan.due_at_ms(NOW, **kwargs) == expected


@pytest.mark.parametrize(
    "kwargs,error,names",
    [
        ({"countdown": math.nan}, ValueError, "countdown"),
        ({"countdown": math.inf}, ValueError, "countdown"),
        ({"countdown": -math.inf}, ValueError, "countdown"),
        ({"countdown": "10"}, TypeError, "countdown"),
        ({"countdown": True}, TypeError, "countdown"),
        ({"countdown": [10]}, TypeError, "countdown"),
        ({"countdown": plan.MAX_DELAY + 1}, ValueError, "countdown"),
        ({"countdown": timedelta(days=3654)}, ValueError, "countdown"),
        ({"countdown": 31_536_000_000}, ValueError, "countdown"),  # a year in milliseconds
        ({"eta": datetime(2030, 1, 1)}, ValueError, "eta"),
        ({"eta": "2030-01-01T00:00:00Z"}, TypeError, "eta"),
        ({"eta": 1_700_000_000}, TypeError, "eta"),
        ({"eta": datetime.fromtimestamp(NOW + plan.MAX_DELAY + 10, timezone.utc)}, ValueError, "eta"),
        ({}, ValueError, "countdown"),
        ({"countdown": 1, "eta": datetime.fromtimestamp(NOW, timezone.utc)}, ValueError, "eta"),
    ],
)
def test_due_at_ms_bad_input(kwargs: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        plan.due_at_ms(NOW, **kwargs)


@pytest.mark.parametrize(
    "given,error",
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("10", TypeError),
        (None, TypeError),
        (plan.MAX_DELAY + 0.5, ValueError),
    ],
)
def test_hops_for_bad_input_names_the_argument(given: object, error: type) -> None:
    with pytest.raises(error, match="delay"):
        plan.hops_for(given)


def test_max_delay_is_ten_years_and_accepted() -> None:
    assert plan.MAX_DELAY == 3653 * 24 * 3600
    assert plan.delay_seconds(plan.MAX_DELAY) == plan.MAX_DELAY
    assert len(plan.hops_for(plan.MAX_DELAY)) == 3653 * 24


def test_a_two_year_eta_is_accepted_as_vanilla_celery_accepts_it() -> None:
    two_years = datetime.fromtimestamp(NOW + 2 * 365 * 86400, timezone.utc)
    assert plan.due_at_ms(NOW, eta=two_years) == NOW * 1000 + 2 * 365 * 86_400_000


def test_a_unit_mistake_names_the_argument_and_the_setting_that_raises_the_limit() -> None:
    with pytest.raises(ValueError, match=r"countdown=31536000000s .*milliseconds.*ladder_max_delay"):
        plan.due_at_ms(NOW, countdown=31_536_000_000)


@pytest.mark.parametrize("max_delay", [60, timedelta(minutes=1), 60.0])
def test_max_delay_is_a_parameter(max_delay: object) -> None:
    limit = plan.check_max_delay(max_delay)
    assert plan.due_at_ms(NOW, countdown=60, max_delay=limit) == (NOW + 60) * 1000
    with pytest.raises(ValueError, match="countdown=61s is longer than the maximum delay of 60s"):
        plan.due_at_ms(NOW, countdown=61, max_delay=limit)
    with pytest.raises(ValueError, match="eta=.* is more than the maximum delay of 60s"):
        plan.due_at_ms(NOW, eta=datetime.fromtimestamp(NOW + 61, timezone.utc), max_delay=limit)
    assert plan.hops_for(3600, max_delay=4000) == (3600,)
    with pytest.raises(ValueError, match="delay=3600s"):
        plan.hops_for(3600, max_delay=limit)


@pytest.mark.parametrize(
    "given,error",
    [(0, ValueError), (-5, ValueError), (math.nan, ValueError), (math.inf, ValueError),
     ("10y", TypeError), (True, TypeError), (None, TypeError)],
)
def test_check_max_delay_refuses_nonsense_naming_the_argument(given: object, error: type) -> None:
    with pytest.raises(error, match="ladder_max_delay"):
        plan.check_max_delay(given, argument="ladder_max_delay")


@pytest.mark.parametrize(
    "given,expected",
    [
        (datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc), 1_700_000_000_000),
        (datetime(2023, 11, 14, 22, 13, 20, 999_999, tzinfo=timezone.utc), 1_700_000_000_999),
        (datetime(1970, 1, 1, tzinfo=timezone.utc), 0),
    ],
)
def test_to_millis(given: datetime, expected: int) -> None:
    assert plan.to_millis(given) == expected


def test_plan_imports_no_kombu() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(plan))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"kombu", "amqp", "celery"}
