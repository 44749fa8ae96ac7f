"""Property tests: the due-at parser, the planner (always delivers, hops bounded), header stripping, clock skew."""

from __future__ import annotations

import re
from typing import Any, Optional

from hostile_corpus import relayed
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from kombu_ladder.contract import RUNGS, SCHEDULE_HEADERS
from kombu_ladder.envelope import (
    ORIGINAL_DELIVERY_MODE,
    Deliver,
    Hop,
    decide,
    scheduled_headers,
)
from kombu_ladder.plan import choose_rung, hops_for, parse_due_at

#: Epoch milliseconds around now, give or take a few decades.
EPOCH_MS = st.integers(min_value=0, max_value=4_000_000_000_000)
#: The delays the properties range over: up to 366 days (MAX_DELAY, ten years, would cost
#: up to 87,672 simulated hops per example; the hop arithmetic is the same past a year).
PROPERTY_RANGE_MS = 366 * 24 * 3600 * 1000
#: A delay within that range, in milliseconds.
DELAY_MS = st.integers(min_value=-10_000, max_value=PROPERTY_RANGE_MS)
#: How late RabbitMQ expires a rung (measured: p99 9 ms; allow far more).
LATENESS_MS = st.lists(st.integers(min_value=0, max_value=2_000), max_size=40)


# -- the due-at parser -----------------------------------------------------------

@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_every_integer_and_its_spellings_parse(value: int) -> None:
    assert parse_due_at(value) == value
    assert parse_due_at(str(value)) == value
    assert parse_due_at(f"  {value}\t") == value
    assert parse_due_at(str(value).encode("ascii")) == value


@given(st.floats(allow_nan=True, allow_infinity=True) | st.booleans() | st.none()
       | st.lists(st.integers()) | st.dictionaries(st.text(), st.integers()))
def test_non_integers_are_malformed(value: Any) -> None:
    assert parse_due_at(value) is None


@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)))
def test_float_strings_are_malformed(value: float) -> None:
    assert parse_due_at(repr(value)) is None
    assert parse_due_at(f"{value:.3f}" if "." in f"{value:.3f}" else "1.5") is None


@given(st.text())
@example("１２３")  # full-width digits: int() reads them, the other AceMQ readers do not
@example("٣")
def test_any_text_parses_only_as_the_ascii_integer_it_spells(text: str) -> None:
    result = parse_due_at(text)
    if result is not None:
        assert text.isascii()
        assert re.fullmatch(r"\s*[+-]?[0-9](_?[0-9])*\s*", text), text
        assert result == int(text.strip())


@given(st.binary())
def test_any_bytes_parse_like_their_ascii_text(raw: bytes) -> None:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        assert parse_due_at(raw) is None
    else:
        assert parse_due_at(raw) == parse_due_at(text)


# -- the planner -------------------------------------------------------------------

#: ``first_rung`` default: the producer and the relay agree on the time.
SAME_CLOCK = -1


def relay_until_delivered(due: int, now: int, lateness: list[int],
                          first_rung: Optional[int] = SAME_CLOCK) -> tuple[int, int]:
    """Drive :func:`decide` as the relay would: return (delivered at, hops).

    Each rung expires ``rung`` seconds later plus the next lateness (0 when the
    list runs out). ``first_rung`` is the producer's own choice (None: it
    published to the target at once), when its clock differs from the relay's.
    """
    headers = scheduled_headers({"app": 1}, exchange="x", routing_key="k", due_at=due, content_type="text/plain")
    late = iter(lateness)
    hops = 0
    rung = choose_rung(due - now) if first_rung == SAME_CLOCK else first_rung
    if rung is None:
        return now, 0  # the producer delivers at once
    while True:
        hops += 1
        now += rung * 1000 + next(late, 0)
        decision = decide(headers, now)
        if isinstance(decision, Deliver):
            assert relayed("deliver", headers, {"type": "ScheduledMessage"})[0] == {"app": 1}
            return now, hops
        assert isinstance(decision, Hop), decision
        assert hops < 10_000, "the planner does not converge"
        rung = decision.rung


def hop_bound(remaining_ms: int) -> int:
    """The most hops any message can take: whole hours, then at most 5 x 10m, 9 x 1m, 5 x 10s, 9 x 1s."""
    return max(remaining_ms, 0) // 3_600_000 + 5 + 9 + 5 + 9


@settings(max_examples=300)
@given(EPOCH_MS, DELAY_MS, LATENESS_MS)
def test_a_message_is_always_delivered_within_a_second_before_due(now: int, delay: int, lateness: list[int]) -> None:
    due = now + delay
    delivered, hops = relay_until_delivered(due, now, lateness)
    assert hops <= hop_bound(delay)
    if delay >= 1000:
        # Delivered when less than the smallest rung remains: up to 1 s early, and late only by
        # what the broker added on the last hop (never by more than one lateness).
        assert due - 1000 < delivered <= due + max(lateness, default=0)
    else:
        assert delivered == now


@given(EPOCH_MS, st.integers(min_value=0, max_value=10 * 24 * 3600 * 1000))
def test_with_punctual_rungs_the_hops_are_exactly_the_forecast(now: int, delay: int) -> None:
    _, hops = relay_until_delivered(now + delay, now, [])
    assert hops == len(hops_for(delay / 1000))


@given(st.integers(min_value=0, max_value=PROPERTY_RANGE_MS))
def test_hop_bound_is_tight_enough(delay: int) -> None:
    assert len(hops_for(delay / 1000)) <= hop_bound(delay)
    assert all(rung in RUNGS for rung in hops_for(delay / 1000))


# -- header stripping ----------------------------------------------------------------

APP_KEYS = st.text(min_size=1, max_size=20).filter(
    lambda k: k not in (*SCHEDULE_HEADERS, ORIGINAL_DELIVERY_MODE, "x-death")
    and not k.startswith(("x-first-death-", "x-last-death-")))
#: Header values as AMQP carries them (its largest integer is 64 bits).
APP_VALUES = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.booleans(), st.none())
DEATH = st.dictionaries(st.sampled_from(["x-death", "x-first-death-queue", "x-first-death-reason",
                                         "x-last-death-exchange", "x-last-death-queue"]),
                        st.text(max_size=10))


@given(st.dictionaries(APP_KEYS, APP_VALUES), DEATH, EPOCH_MS, st.sampled_from([None, 1, 2]))
def test_delivery_keeps_every_application_header_and_nothing_else(
    app: dict[str, Any], death: dict[str, Any], due: int, mode: Optional[int],
) -> None:
    headers = {**scheduled_headers(app, exchange="e", routing_key="k", due_at=due, content_type="a/b",
                                   delivery_mode=mode), **death}
    stripped, _ = relayed("deliver", headers, {})
    assert stripped == app
    assert relayed("deliver", stripped, {})[0] == stripped  # idempotent


@given(st.dictionaries(APP_KEYS, APP_VALUES), DEATH, EPOCH_MS)
def test_a_hop_keeps_the_schedule_headers_and_drops_only_the_death_headers(
    app: dict[str, Any], death: dict[str, Any], now: int,
) -> None:
    headers = {**scheduled_headers(app, exchange="e", routing_key="k", due_at=now + 5_000, content_type="a/b"),
               **death}
    decision = decide(headers, now)
    assert isinstance(decision, Hop)
    assert relayed("hop", headers, {})[0] == {k: v for k, v in headers.items() if k not in death}


# -- clock skew (the producer's injectable clock against the relay's) ---------------------

@settings(max_examples=300)
@given(EPOCH_MS, st.integers(min_value=0, max_value=3 * 3600 * 1000),
       st.integers(min_value=-2 * 3600 * 1000, max_value=2 * 3600 * 1000))
def test_clock_skew_shifts_delivery_by_the_skew_and_never_strands_a_message(
    true_now: int, countdown: int, skew: int,
) -> None:
    """A producer whose clock is ``skew`` ms ahead (negative: behind) of the relay's.

    The due-at header is absolute, read by the relay's clock: the message is
    delivered ``skew`` late (ahead) or early (behind), to within the ladder's
    1 s, except that it never leaves before its first rung (chosen from the
    countdown alone) expires. It is always delivered, with bounded hops.
    """
    assume(true_now + skew >= 0)
    due = true_now + skew + countdown  # what the producer writes
    first = choose_rung(countdown)  # the producer places by its own clock: the countdown itself
    delivered, hops = relay_until_delivered(due, true_now, [], first_rung=first)
    intended = true_now + countdown
    if first is None:
        assert delivered == true_now  # under a second: published to the target at once
        return
    earliest_exit = true_now + first * 1000
    assert delivered >= earliest_exit
    assert delivered <= max(due, earliest_exit)
    if due - 1000 >= earliest_exit:
        assert intended + skew - 1000 < delivered <= intended + skew  # shifted by exactly the skew
    assert hops <= hop_bound(max(countdown, countdown + skew))
