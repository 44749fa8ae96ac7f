"""The relay's target-exchange allow-list: the core predicate, the Celery setting and the bootstep."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_ladder.bootstep import LadderRelay
from celery_ladder.settings import LadderSettings, as_exchanges
from kombu_ladder.envelope import Deliver, Park, decide, scheduled_headers
from kombu_ladder.relay import AllowList


@pytest.mark.parametrize("given,exchange,expected", [
    (None, "anything", True),
    (None, "", True),
    (["billing"], "billing", True),
    (["billing"], "billing2", False),
    (["billing"], "", False),
    (["", "billing"], "", True),
    ([], "billing", False),
])
def test_allow_list(given: Any, exchange: str, expected: bool) -> None:
    assert AllowList(given)(exchange) is expected


def test_allow_list_refuses_a_single_string() -> None:
    with pytest.raises(TypeError, match="allowed_exchanges"):
        AllowList("billing")


def test_a_refused_target_is_parked_not_delivered() -> None:
    headers = scheduled_headers({}, exchange="amq.topic", routing_key="k", due_at=0, content_type="text/plain")
    refused = decide(headers, 1_000, allow_exchange=AllowList(["billing"]))
    assert isinstance(refused, Park) and refused.reason.startswith("refused: ")
    assert "'amq.topic'" in refused.reason
    assert isinstance(decide(headers, 1_000, allow_exchange=AllowList(["amq.topic"])), Deliver)


@pytest.mark.parametrize("given,expected", [
    (None, None),
    (["celery", ""], frozenset({"celery", ""})),
    (("a",), frozenset({"a"})),
    ({"a", "b"}, frozenset({"a", "b"})),
    ([], frozenset()),
])
def test_setting_values(given: Any, expected: Any) -> None:
    assert as_exchanges(given) == expected
    assert LadderSettings.from_conf({"ladder_allowed_exchanges": given}).allowed_exchanges == expected


@pytest.mark.parametrize("bad", ["celery", [1], {"a": 1}, 5, [b"celery"]])
def test_bad_setting_names_itself(bad: Any) -> None:
    with pytest.raises(TypeError, match="ladder_allowed_exchanges.*CELERY_LADDER_ALLOWED_EXCHANGES"):
        LadderSettings.from_conf({"ladder_allowed_exchanges": bad})


def test_default_allows_every_exchange() -> None:
    assert LadderSettings.from_conf({}).allowed_exchanges is None


@pytest.mark.parametrize("setting,exchange,expected", [
    (None, "anywhere", True),
    (["celery"], "celery", True),
    (["celery"], "anywhere", False),
])
def test_bootstep_relay_uses_the_setting(setting: Any, exchange: str, expected: bool) -> None:
    consumer = SimpleNamespace(app=SimpleNamespace(conf={"ladder_allowed_exchanges": setting}))
    step = LadderRelay(consumer)
    assert step.relay.core.allow(exchange) is expected
