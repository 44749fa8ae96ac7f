"""The relay's byte budget for held messages: what it holds, when it stops taking messages, never early."""

from __future__ import annotations

import pytest

from celery_ladder.settings import LadderSettings
from kombu_ladder.contract import DUE_AT, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from kombu_ladder.envelope import Deliver, Hold, Hop, decide
from kombu_ladder.plan import HOLD, HOLD_BYTES, MAX_HOLD_BYTES, Step, check_hold_bytes
from kombu_ladder.relay import RelayOptions
from kombu_ladder.relay.holder import Holder

MIB = 1024 * 1024


def holder(budget: int, *, capacity: int = 2000, window_ms: int = 10_000) -> Holder:
    return Holder(window_ms=window_ms, capacity=capacity, budget=budget)


NOW = 1_800_000_000_000


def step(held: Holder, remaining_ms: int, size: int) -> Step:
    """What the relay does: the pure verdict, given the holder's window and room as values, then the holder
    acts on it (:meth:`Holder.step`); the verdict as a step (a rung, HOLD, or None: deliver now)."""
    headers = {DUE_AT: NOW + remaining_ms, TARGET_EXCHANGE: "billing", TARGET_ROUTING_KEY: "invoice"}
    verdict = decide(headers, NOW, hold_window_ms=held.window_ms, can_hold=held.fits(size))
    held.step(verdict)
    if isinstance(verdict, Hold):
        return HOLD
    if isinstance(verdict, Hop):
        return verdict.rung
    assert isinstance(verdict, Deliver), verdict
    return None


def test_messages_are_held_while_their_bytes_fit_the_budget() -> None:
    held = holder(3 * MIB)
    for n in range(3):
        assert step(held, 5_000, MIB) is HOLD
        held.hold(1_000 + n, f"m{n}", 0.0, size=MIB)
    assert held.bytes == 3 * MIB and held.full
    assert step(held, 5_000, 1) == 1, "no room: a rung, not held"


def test_a_message_bigger_than_the_whole_budget_is_still_held_alone() -> None:
    held = holder(MIB)
    assert step(held, 5_000, 10 * MIB) is HOLD
    held.hold(1_000, "big", 0.0, size=10 * MIB)
    assert held.full
    assert step(held, 5_000, 1) != HOLD, "a second message waits for the big one to go"
    assert held.take_due(1.0) == ["big"]
    assert held.bytes == 0 and not held.full and step(held, 5_000, 10 * MIB) is HOLD


@pytest.mark.parametrize("remaining_ms", [1, 500, 999])
def test_over_budget_the_last_second_takes_the_1s_rung_never_delivered_early(remaining_ms: int) -> None:
    held = holder(MIB)
    held.hold(1_000, "first", 0.0, size=MIB)
    assert step(held, remaining_ms, 1) == 1


@pytest.mark.parametrize("remaining_ms", [1, 999])
def test_a_full_count_also_takes_the_1s_rung_in_the_last_second(remaining_ms: int) -> None:
    held = holder(HOLD_BYTES, capacity=1)
    held.hold(1_000, "first", 0.0, size=10)
    assert step(held, remaining_ms, 10) == 1


def test_a_due_message_is_delivered_and_holding_off_keeps_the_contracts_rule() -> None:
    held = holder(MIB)
    held.hold(1_000, "first", 0.0, size=MIB)
    assert step(held, 0, 1) is None and step(held, -5, 1) is None
    off = holder(MIB, window_ms=0)
    assert step(off, 500, 1) is None, "holding off: the contract's behaviour, up to a second early"


def test_over_budget_a_message_further_ahead_takes_its_usual_rung() -> None:
    held = holder(MIB)
    held.hold(1_000, "first", 0.0, size=MIB)
    assert step(held, 7_000, 1) == 1
    assert step(held, 65_000, 1) == 60


def test_taking_new_messages_again_waits_for_half_the_budget() -> None:
    held = holder(4 * MIB)
    for n in range(4):
        held.hold(1_000 * (n + 1), n, 0.0, size=MIB)
    assert held.full and not held.roomy
    held.take_due(1.0)
    assert not held.full and not held.roomy, "one freed: hysteresis, not a pause per message"
    held.take_due(2.0)
    assert held.roomy and held.bytes == 2 * MIB
    held.release()
    assert held.bytes == 0 and held.roomy and not held.full


def test_an_empty_holder_is_never_full() -> None:
    assert not holder(1).full


@pytest.mark.parametrize("bad", [0, -1, 1.5, "64", True, None, MAX_HOLD_BYTES + 1])
def test_a_bad_budget_is_refused_naming_the_option(bad: object) -> None:
    with pytest.raises(ValueError, match="hold_bytes"):
        check_hold_bytes(bad)
    with pytest.raises(ValueError, match="hold_bytes"):
        RelayOptions(hold_bytes=bad)  # type: ignore[arg-type]


def test_the_budget_reaches_the_relay_from_the_options_and_the_celery_setting() -> None:
    assert RelayOptions().hold_bytes == HOLD_BYTES == 64 * MIB
    assert RelayOptions(hold_bytes=MIB).hold_bytes == MIB
    settings = LadderSettings.from_conf({"ladder_hold_bytes": "1048576"})
    assert settings.relay_options().hold_bytes == MIB
    with pytest.raises(ValueError, match="setting ladder_hold_bytes .CELERY_LADDER_HOLD_BYTES"):
        LadderSettings.from_conf({"ladder_hold_bytes": "1 MiB"})


def test_a_message_refused_for_its_bytes_stops_the_relay_taking_more_until_half_is_free() -> None:
    held = holder(5 * MIB)
    for n in range(4):
        held.hold(1_000 * (n + 1), n, 0.0, size=MIB)
    assert not held.full, "4 MiB of 5: room left"
    assert step(held, 5_000, 2 * MIB) == 1, "2 MiB more does not fit: a rung"
    assert held.full, "refused for its bytes: stop taking messages"
    held.take_due(1.0)
    assert held.full, "3 MiB left of 5 after one went: still more than half"
    held.take_due(2.0)
    assert not held.full and held.roomy


def test_a_full_count_does_not_stop_the_relay_taking_messages() -> None:
    held = holder(HOLD_BYTES, capacity=1)
    held.hold(1_000, "first", 0.0, size=10)
    assert step(held, 5_000, 10) == 1
    assert not held.full, "the count bounds the window's prefetch already; hops keep flowing"
