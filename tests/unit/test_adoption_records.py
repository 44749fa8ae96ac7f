"""Adoption's pure part: what a worker decides for a task message, and the record format (issue 23)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_ladder.adoption.records import (
    ADOPT,
    ADOPTED_HEADER,
    CHECK,
    MIN_AHEAD,
    RUN,
    Adopted,
    Adoption,
    encode,
    threshold,
    verdict,
)

NOW = 1_800_000_000_000
ETA = "2027-01-15T10:00:00+00:00"
AHEAD = 10_000  # the default hold window, in ms


@pytest.mark.parametrize("headers,redelivered,due,expected", [
    ({"id": "a", "eta": ETA}, False, NOW + 600_000, ADOPT),            # ten minutes ahead
    ({"id": "a", "eta": ETA}, False, NOW + AHEAD + 1, ADOPT),          # just past the hold window
    ({"id": "a", "eta": ETA}, False, NOW + AHEAD, RUN),                # within it: the worker holds it
    ({"id": "a", "eta": ETA}, False, NOW - 5_000, RUN),                # due already
    ({"id": "a", "eta": ETA}, True, NOW + 600_000, CHECK),             # redelivered: was it adopted already?
    ({"id": "a", "eta": ETA}, True, NOW - 5_000, CHECK),               # ... even when due (its copy may have run)
    ({"id": "a", "eta": ETA, ADOPTED_HEADER: ETA}, False, NOW + 600_000, RUN),   # a copy: never adopted again
    ({"id": "a", "eta": ETA, ADOPTED_HEADER: ETA}, True, NOW + 600_000, RUN),
    ({"id": "a", "eta": ETA, ADOPTED_HEADER: "2026-01-01T00:00:00+00:00"}, False, NOW + 600_000, ADOPT),  # a retry
    ({"id": "a", "eta": None}, False, NOW + 600_000, RUN),
    ({"id": "a", "eta": ETA}, False, None, RUN),                       # an ETA the worker cannot read
])
def test_verdict(headers: dict[str, Any], redelivered: bool, due: Any, expected: str) -> None:
    assert verdict(headers, redelivered=redelivered, due_ms=due, now_ms=NOW, ahead_ms=AHEAD) == expected


@pytest.mark.parametrize("window,expected", [(10.0, 10.0), (0.0, MIN_AHEAD), (0.5, 1.0), (600, 600.0)])
def test_the_threshold_is_the_hold_window_and_never_below_the_smallest_rung(window: float, expected: float) -> None:
    assert threshold(window) == expected


def test_encode_refuses_what_no_record_can_hold() -> None:
    with pytest.raises(ValueError, match="field 'id'"):
        encode("", ETA, due=NOW)
    with pytest.raises(ValueError, match="field 'due'"):
        encode("a", ETA, due=-1)


def test_an_adoption_is_known_by_id_and_eta_until_its_due_time_plus_the_margin() -> None:
    adopted = Adopted(margin_ms=1000)
    assert adopted.add(Adoption("a", ETA, NOW + 5000), NOW)
    assert ("a", ETA) in adopted and ("a", "another eta") not in adopted and ("b", ETA) not in adopted
    assert not adopted.add(Adoption("old", ETA, NOW - 2000), NOW)  # past due + margin: not kept
    assert adopted.prune(NOW + 5999) == 0 and len(adopted) == 1
    assert adopted.prune(NOW + 6000) == 1 and ("a", ETA) not in adopted


class _Message:
    """What the gate reads of a kombu message."""

    def __init__(self, headers: dict[str, Any], redelivered: bool = False) -> None:
        self.headers = headers
        self.delivery_info = {"redelivered": redelivered}


class _Adopter:
    ahead_ms = AHEAD

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def submit(self, job: Any) -> None:
        self.jobs.append(job)


def _gate(revoked: Any = ()) -> Any:
    from celery_ladder.adoption.worker import Gate

    return Gate(_Adopter(), clock=lambda: NOW / 1000, timezone=lambda: None, revoked=set(revoked))  # type: ignore[arg-type]


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()


@pytest.mark.parametrize("headers,redelivered,revoked,expected", [
    ({"id": "a", "eta": _iso(NOW + 600_000)}, False, (), ADOPT),
    ({"id": "a", "eta": _iso(NOW + 600_000)}, True, (), CHECK),
    ({"id": "a", "eta": _iso(NOW + 5_000)}, False, (), None),                           # within the hold window
    ({"id": "a", "eta": _iso(NOW + 600_000)}, False, ("a",), None),                     # revoked: Celery discards it
    ({"id": "a", "eta": _iso(NOW + 600_000), "expires": _iso(NOW - 1)}, False, (), None),  # expired: likewise
    ({"id": "a", "eta": _iso(NOW + 600_000), "expires": _iso(NOW + 1_000)}, False, (), ADOPT),  # expires later on
    ({"id": "a", "eta": "next tuesday"}, False, (), None),                              # unreadable: Celery says so
    ({"id": "a"}, False, (), None),
    ({"id": "a", "eta": _iso(NOW + 600_000), ADOPTED_HEADER: _iso(NOW + 600_000)}, False, (), None),  # a copy
])
def test_the_gate_hands_over_only_what_celery_would_hold(headers: dict[str, Any], redelivered: bool, revoked: Any,
                                                         expected: Any) -> None:
    gate = _gate(revoked)
    ran: list[str] = []
    strategy = gate.wrap(lambda message, body, ack, reject, callbacks=None: ran.append(message.headers["id"]))
    message = _Message(dict(headers), redelivered)
    strategy(message, None, None, None, None)
    assert [job.verdict for job in gate.adopter.jobs] == ([] if expected is None else [expected])
    assert ran == ([] if expected else ["a"])
    assert ADOPTED_HEADER not in message.headers, "Celery never reads the adoption header"


def test_a_stale_adoption_header_is_dropped_and_the_message_taken_for_an_original() -> None:
    gate = _gate()
    message = _Message({"id": "a", "eta": _iso(NOW + 600_000), ADOPTED_HEADER: _iso(NOW - 600_000)})
    gate.wrap(lambda *args, **kwargs: None)(message, None, None, None)
    assert [job.verdict for job in gate.adopter.jobs] == [ADOPT] and ADOPTED_HEADER not in message.headers
