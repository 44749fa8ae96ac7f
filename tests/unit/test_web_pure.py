"""The web console's pure parts: binding and credentials, CSRF tokens, filters, paging, charts, previews."""

from __future__ import annotations

import base64
import json

import pytest
from hostile_corpus import MARKUP

from kombu_ladder.index import Entry, Filter, Row
from kombu_ladder.parking import Parked
from kombu_ladder.web import views
from kombu_ladder.web.options import ConsoleOptions
from kombu_ladder.web.preview import header_rows, preview, shown
from kombu_ladder.web.security import (
    Auth,
    authorized,
    check_bind,
    check_secret,
    csrf_ok,
    csrf_token,
    is_loopback,
    new_key,
    same_origin,
)

NOW = 1_796_500_000_000  # 2026-12-05T...Z, on a minute
SECRET = "correct horse battery staple"


@pytest.mark.parametrize("host,expected", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("api.localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.com", False),
    ("", False),
])
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_a_non_loopback_bind_needs_credentials() -> None:
    check_bind("127.0.0.1", Auth())
    with pytest.raises(ValueError, match="--host 0.0.0.0 .*--password-file.*--token-file"):
        check_bind("0.0.0.0", Auth())
    with pytest.raises(ValueError, match="--host"):
        ConsoleOptions(host="192.168.1.4")
    check_bind("0.0.0.0", Auth(password=SECRET))
    check_bind("0.0.0.0", Auth(token=SECRET))
    with pytest.raises(ValueError, match="--user"):
        check_bind("127.0.0.1", Auth(user="a:b", password=SECRET))


def test_secrets_are_long_enough_and_never_printed() -> None:
    assert check_secret(SECRET + "\n", option="--password-file") == SECRET
    with pytest.raises(ValueError, match="--token-file: the secret must be at least 16 characters"):
        check_secret("short\n", option="--token-file")
    assert SECRET not in repr(Auth(password=SECRET, token=SECRET))


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("header,expected", [
    (None, False), ("", False), (_basic("admin", SECRET), True), (_basic("admin", SECRET + "x"), False),
    (_basic("root", SECRET), False), ("Basic !!!", False), ("Basic " + base64.b64encode(b"admin").decode(), False),
    (f"Bearer {SECRET}", False),  # no token configured
    ("Digest whatever", False),
])
def test_basic_auth(header: str, expected: bool) -> None:
    assert authorized(Auth(password=SECRET), header) is expected


@pytest.mark.parametrize("header,expected", [
    (f"Bearer {SECRET}", True), (f"bearer   {SECRET}", True), (f"Bearer {SECRET[:-1]}", False),
    (_basic("admin", SECRET), False), (None, False),
])
def test_bearer_auth(header: str, expected: bool) -> None:
    assert authorized(Auth(token=SECRET), header) is expected


def test_no_auth_configured_lets_everyone_in() -> None:
    assert authorized(Auth(), None)


def test_csrf_tokens_bind_to_the_session_and_the_key() -> None:
    key = new_key()
    token = csrf_token(key, "session-a")
    assert csrf_ok(key, "session-a", token)
    assert not csrf_ok(key, "session-b", token)
    assert not csrf_ok(new_key(), "session-a", token)
    assert not csrf_ok(key, "session-a", None)
    assert not csrf_ok(key, None, token)
    assert not csrf_ok(key, "session-a", "")


@pytest.mark.parametrize("origin,host,expected", [
    (None, "127.0.0.1:8642", True), ("http://127.0.0.1:8642", "127.0.0.1:8642", True),
    ("https://evil.example", "127.0.0.1:8642", False), ("null", "127.0.0.1:8642", False),
    ("http://127.0.0.1:8642", None, False),
])
def test_same_origin(origin: str, host: str, expected: bool) -> None:
    assert same_origin(origin, host) is expected


def test_options_name_the_option_at_fault() -> None:
    with pytest.raises(ValueError, match="--refresh"):
        ConsoleOptions(refresh=0.1)
    with pytest.raises(ValueError, match="--page-size"):
        ConsoleOptions(page_size=0)
    with pytest.raises(ValueError, match="--port"):
        ConsoleOptions(port=70000)


def test_filter_form_reads_times_and_targets() -> None:
    form = views.filter_form({"task": "billing.send", "target": views.DEFAULT_TARGET, "routing_key": "invoices",
                        "due_after": "+10m", "due_before": "2026-12-24T18:00"}, NOW)
    assert form.errors == ()
    assert form.found == Filter(due_after=NOW + 600_000, due_before=1_798_135_200_000, exchange="",
                                routing_key="invoices", task="billing.send")
    assert form.narrowed
    assert not views.filter_form({"due_after": "+1h"}, NOW).narrowed
    assert views.filter_form({"target": "billing"}, NOW).found.exchange == "billing"
    assert views.filter_form({"id": " abc "}, NOW).ident == "abc"


def test_filter_form_names_the_field_it_cannot_read() -> None:
    form = views.filter_form({"due_before": "tomorrow-ish"}, NOW)
    assert len(form.errors) == 1 and form.errors[0].startswith("due_before:")


@pytest.mark.parametrize("offset,total,expected", [
    ("0", 120, (0, 1, 50, None, 50)), ("50", 120, (50, 51, 100, 0, 100)), ("100", 120, (100, 101, 120, 50, None)),
    ("999", 120, (100, 101, 120, 50, None)), ("-5", 120, (0, 1, 50, None, 50)), ("x", 120, (0, 1, 50, None, 50)),
    ("0", 0, (0, 0, 0, None, None)),
])
def test_paging(offset: str, total: int, expected: tuple) -> None:
    page = views.page_of(offset, 50, total)
    assert (page.offset, page.first, page.last, page.previous, page.next) == expected


@pytest.mark.parametrize("delta_s,text", [(0, "in 0s"), (45, "in 45s"), (-12, "12s ago"), (250, "in 4m 10s"),
                                          (7380, "in 2h 3m"), (-90000, "1d 1h ago")])
def test_ago(delta_s: int, text: str) -> None:
    assert views.ago(NOW + delta_s * 1000, NOW) == text


def test_iso_and_link() -> None:
    assert views.iso(0) == "1970-01-01 00:00:00Z" and views.iso(None) == "-"
    assert views.link("/message", id="a&b=<c>", offset=None) == "/message?id=a%26b%3D%3Cc%3E"
    assert views.link("/waiting", task="") == "/waiting"


@pytest.mark.parametrize("ahead_s,queue", [(7200, "acemq.schedule.1h"), (3600, "acemq.schedule.1h"),
                                            (599, "acemq.schedule.1m"), (5, "acemq.schedule.1s"),
                                            (0.5, "acemq.schedule.due"), (-3, "acemq.schedule.due")])
def test_rung_for(ahead_s: float, queue: str) -> None:
    assert views.rung_for(NOW + int(ahead_s * 1000), NOW) == queue


def test_charts_scale_to_the_busiest_bucket() -> None:
    counts = [0] * 60
    counts[3], counts[10] = 1, 400
    chart = views.hour_chart(counts, NOW)
    assert chart.total == 401 and chart.peak == 400 and len(chart.bars) == 60
    tallest = chart.bars[10]
    assert tallest.y == 0 and tallest.height == 140 - 18
    assert chart.bars[3].height >= 1  # one message stays visible
    assert chart.bars[0].height == 0
    assert [label for _, label in chart.ticks][:2] == [views.iso(NOW)[11:16], views.iso(NOW + 600_000)[11:16]]
    assert len(views.day_chart([0] * 24, NOW).ticks) == 8
    assert views.hour_chart([0] * 60, NOW).peak == 0


def test_depth_rows() -> None:
    from kombu_ladder.depths import QueueDepth

    rows = views.depth_rows([QueueDepth("acemq.schedule.1h", 50, 0), QueueDepth("acemq.schedule.due", 0, 2),
                       QueueDepth("acemq.schedule.parked", None, None)])
    assert [(r.label, r.width) for r in rows] == [("rung of 1h", 100.0), ("control queue (relays consume it)", 0.0),
                                                   ("parking queue", 0.0)]


def test_counter_table_keeps_errors_apart() -> None:
    table = views.counter_table({"w2@h": {"relay": True, "delivered": 3}, "w1@h": {"delivered": 1, "hops": 2},
                           "old@h": {"error": "No such command"}})
    assert table.columns == ("delivered", "hops", "relay")
    assert table.rows == (("w1@h", ("1", "2", "-")), ("w2@h", ("3", "-", "True")))
    assert table.errors == (("old@h", "No such command"),)


def test_parked_groups_largest_first() -> None:
    def parked(position: int, reason: str, parked_id: object = "p") -> Parked:
        return Parked(position, parked_id, reason, {}, {}, b"")  # type: ignore[arg-type]

    groups = views.parked_groups([parked(1, "b"), parked(2, "a"), parked(3, "a", None), parked(4, "c")])
    assert [(g.reason, g.count, g.addressable) for g in groups] == [("a", 2, 1), ("b", 1, 1), ("c", 1, 1)]


def test_waiting_row() -> None:
    entry = Entry("m-1", "t-1", "billing.send", "", "invoices", NOW + 90_000, NOW, 12)
    row = views.waiting_row(Row(entry, "waiting"), NOW)
    assert (row.ident, row.task, row.rung, row.relative) == ("t-1", "billing.send", "acemq.schedule.1m", "in 1m 30s")
    assert row.target == f"{views.DEFAULT_TARGET} \u2192 invoices"


def _celery_headers(**extra: object) -> dict:
    return {"task": "billing.send", "id": "t-1", **extra}


def test_preview_decodes_a_celery_tasks_args_and_kwargs() -> None:
    body = json.dumps([[1, "two"], {"invoice": 42}, {"callbacks": None}]).encode()
    shown_body = preview(body, content_type="application/json", content_encoding="utf-8", headers=_celery_headers())
    assert shown_body.kind == "celery"
    assert json.loads(shown_body.args or "") == [1, "two"] and json.loads(shown_body.kwargs or "") == {"invoice": 42}


def test_preview_pretty_prints_json_and_caps_text() -> None:
    assert preview(b'{"a":[1,2]}', content_type="application/json", content_encoding="utf-8",
                   headers={}).text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    long = preview(b"x" * 10_000, content_type="text/plain", content_encoding="utf-8", headers={}, limit=100)
    assert long.kind == "text" and long.truncated and len(long.text) == 100 and long.size == 10_000


def test_preview_never_inflates_and_shows_bytes_as_bytes() -> None:
    compressed = preview(b"\x78\x9c" + b"\x00" * 5000, content_type="application/json", content_encoding="utf-8",
                         headers={"compression": "application/x-gzip"})
    assert compressed.kind == "compressed" and "not inflated" in compressed.notes[0]
    binary = preview(bytes(range(256)), content_type="application/octet-stream", content_encoding="binary",
                     headers={})
    assert binary.kind == "binary" and binary.text.startswith("00000000  00 01 02")
    pickled = preview(b"\x80\x04K\x01.", content_type="application/x-python-serialize", content_encoding="binary",
                      headers={})
    assert pickled.kind == "binary"


@pytest.mark.parametrize("text", MARKUP)
def test_previews_and_headers_make_control_characters_visible(text: str) -> None:
    shown_text = preview(text.encode(), content_type="text/plain", content_encoding="utf-8", headers={}).text
    assert "\x00" not in shown_text and "\x1b" not in shown_text and "\u202e" not in shown_text
    [(name, value)] = header_rows({text: text})
    for part in (name, value, shown(text)):
        assert part.isprintable()


METRICS = """# HELP ladder_delivered_total Messages delivered to their target, confirmed by the broker.
# TYPE ladder_delivered_total counter
ladder_delivered_total 12.0
ladder_delivered_created 1.7e9
ladder_hops_total 3.0
ladder_parked_total{reason="malformed"} 1.0
ladder_parked_total{reason="unroutable"} 2.0
ladder_cancellations_enforced 1.0
ladder_queue_messages{queue="acemq.schedule.1h"} 40.0
ladder_received_total not-a-number
other_total 9.0
"""


def test_relay_counters_from_a_metrics_page() -> None:
    assert views.relay_counters(METRICS) == {"relay": True, "cancellations": True, "delivered": 12, "hops": 3,
                                             "parked": 3}
    assert views.relay_counters("") == {"relay": True}
