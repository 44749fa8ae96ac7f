"""The relay's timing rules as tables: rung choice with the broker's expiry lag, and the hold window."""

from __future__ import annotations

import itertools

import pytest

from kombu_ladder.contract import RUNGS
from kombu_ladder.plan import (
    HOLD,
    check_hold_capacity,
    check_hold_window,
    choose_rung,
    fit_rung,
    forecast,
    hops_for,
    step,
    tolerance_ms,
)

HOUR, DAY = 3600, 86400


@pytest.mark.parametrize("rung,expected", [(3600, 90), (600, 20), (60, 20), (10, 20), (1, 20)])
def test_tolerance_of_each_rung(rung: int, expected: int) -> None:
    assert tolerance_ms(rung) == expected


@pytest.mark.parametrize("remaining_ms,expected", [
    (3_600_000, 3600),
    (3_599_997, 3600),     # one hop's lag short of an hour: stays in the hour rung
    (3_599_910, 3600),     # the tolerance's edge
    (3_599_909, 600),
    (59_997, 60),
    (59_980, 60),
    (59_979, 10),
    (9_985, 10),
    (1_000, 1),
    (980, 1),
    (979, None),
    (0, None),
    (-5, None),
])
def test_fit_rung(remaining_ms: int, expected: object) -> None:
    assert fit_rung(remaining_ms) == expected


@pytest.mark.parametrize("remaining_ms", [*range(-2000, 4000, 7), *range(59_000, 61_000, 3),
                                          *range(3_599_000, 3_601_000, 11), 86_400_000, 10**12])
def test_a_rung_never_overshoots_what_remains_by_more_than_its_tolerance(remaining_ms: int) -> None:
    rung = fit_rung(remaining_ms)
    if rung is None:
        assert remaining_ms < 1000 - tolerance_ms(1)
    else:
        assert rung * 1000 <= remaining_ms + tolerance_ms(rung)
        # and it is the largest such rung, never smaller than the plain rule's
        assert all(r * 1000 > remaining_ms + tolerance_ms(r) for r in RUNGS if r > rung)
        assert choose_rung(remaining_ms) in (None, rung, *[r for r in RUNGS if r < rung])


@pytest.mark.parametrize("remaining_ms,window,can_hold,expected", [
    (5_000, 10_000, True, HOLD),
    (9_999, 10_000, True, HOLD),
    (10_000, 10_000, True, 10),
    (5_000, 10_000, False, 1),     # hold capacity full: the 1 s rung
    (500, 10_000, False, None),    # ... and under a second: deliver now, as the contract allows
    (500, 1_000, True, HOLD),
    (500, 0, True, None),          # holding off: up to a second early, as AceMQ's relays
    (0, 10_000, True, None),       # due: deliver
    (-30, 10_000, True, None),
    (59_997, 10_000, True, 60),
])
def test_step(remaining_ms: int, window: int, can_hold: bool, expected: object) -> None:
    assert step(remaining_ms, hold_window_ms=window, can_hold=can_hold) is expected or \
        step(remaining_ms, hold_window_ms=window, can_hold=can_hold) == expected


@pytest.mark.parametrize("delay", [120, HOUR, 4 * HOUR, DAY, 60, 300, 600])
@pytest.mark.parametrize("lag_ms", [0, 2, 3])
def test_round_delays_take_their_theoretical_placements_with_a_lagging_broker(delay: int, lag_ms: int) -> None:
    rungs, arrival = forecast(delay * 1000, lag_ms=lag_ms, hold_window_ms=10_000)
    assert abs(len(rungs) - len(hops_for(delay))) <= 1
    # late by the lag of each hop, never by more than the last rung's tolerance plus one lag
    assert 0 <= arrival <= len(rungs) * lag_ms
    assert arrival <= tolerance_ms(rungs[-1]) + lag_ms


@pytest.mark.parametrize("delay_ms,lag_ms,expected", [
    (120_000, 3, ((60, 60), 6)),
    (3_600_000, 3, ((3600,), 3)),
    (14_400_000, 3, ((3600,) * 4, 12)),
    (86_400_000, 3, ((3600,) * 24, 72)),   # 24 lags: the bound of 24 one-hour hops (see docs/how.rst)
    (90_000, 3, ((60, 10, 10), 0)),        # then held 9.994 s
    (75_000, 3, ((60, 10), 0)),            # then held 4.997 s: no 1 s hop
    (37_500, 0, ((10, 10, 10), 0)),
])
def test_forecast_table(delay_ms: int, lag_ms: int, expected: object) -> None:
    assert forecast(delay_ms, lag_ms=lag_ms, hold_window_ms=10_000) == expected


@pytest.mark.parametrize("delay_ms,lag_ms", [(86_400_000, 5), (30 * 86_400_000, 3), (95_000, 9)])
def test_lateness_does_not_grow_with_hops_when_the_lag_outgrows_the_tolerance(delay_ms: int, lag_ms: int) -> None:
    rungs, arrival = forecast(delay_ms, lag_ms=lag_ms, hold_window_ms=10_000)
    assert arrival == 0  # it stepped down and was held to its due time
    assert len(rungs) < len(hops_for(delay_ms / 1000)) * 2  # the step-down costs hops, not lateness


def test_no_plan_of_24_hours_in_25_placements_or_fewer_is_within_50_ms_at_3_ms_a_hop() -> None:
    """The bound docs/how.rst states, by brute force over every multiset of rungs (not bench/rounds.py's search)."""
    delay, lag, window = DAY * 1000, 3, 10_000
    for n in range(1, 26):
        for plan in itertools.combinations_with_replacement(RUNGS, n):
            end = sum(plan) * 1000 + n * lag
            assert not delay - window < end <= delay + 50, plan


def test_without_holding_the_residual_is_delivered_up_to_a_second_early() -> None:
    rungs, arrival = forecast(37_500, hold_window_ms=0)
    assert -1000 < arrival < 0 and rungs == hops_for(37.5)


@pytest.mark.parametrize("value,error", [(-1, ValueError), (601, ValueError), ("5", TypeError),
                                          (True, TypeError), (float("nan"), ValueError)])
def test_check_hold_window_names_the_setting(value: object, error: type) -> None:
    with pytest.raises(error, match="hold_window"):
        check_hold_window(value)


def test_check_hold_window_and_capacity_accept() -> None:
    assert check_hold_window(0) == 0.0 and check_hold_window(2.5) == 2.5
    assert check_hold_capacity(0) == 0 and check_hold_capacity(10) == 10
    with pytest.raises(ValueError, match="hold_capacity"):
        check_hold_capacity(-1)


@pytest.mark.parametrize("value,expected", [(None, 10.0), (0, 0.0), ("2.5", 2.5), (30, 30.0)])
def test_celery_setting_ladder_hold_window(value: object, expected: float) -> None:
    from celery_ladder.settings import LadderSettings

    assert LadderSettings.from_conf({"ladder_hold_window": value}).hold_window == expected


@pytest.mark.parametrize("value,error", [("soon", ValueError), (-1, ValueError), ([1], TypeError)])
def test_celery_setting_ladder_hold_window_errors_name_it(value: object, error: type) -> None:
    from celery_ladder.settings import LadderSettings

    with pytest.raises(error, match="ladder_hold_window .CELERY_LADDER_HOLD_WINDOW"):
        LadderSettings.from_conf({"ladder_hold_window": value})


def test_a_relay_with_holding_off_consumes_with_the_contracts_prefetch() -> None:
    from kombu_ladder.relay import RelayCore, RelayOptions

    assert RelayCore(options=RelayOptions(hold_window=0)).held.capacity == 0
    assert RelayCore().held.capacity == 2000
    with pytest.raises(ValueError, match="hold_window"):
        RelayOptions(hold_window=-1)
