"""The web console over HTTP (Starlette's TestClient, in-process) on the simulator: CSRF, authentication,
read-only, the hostile corpus rendered inert, and each action doing what it reports."""

from __future__ import annotations

import base64
import json
import re
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest
from hostile_corpus import MARKUP, MARKUP_SIGNS

pytest.importorskip("starlette", reason="the [web] extra")
with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works with every release allowed
    warnings.filterwarnings("ignore", "Using `httpx` with")
    from starlette.testclient import TestClient

from kombu_ladder.cancellation.stream import cancel_many  # noqa: E402
from kombu_ladder.contract import PARKED_REASON, PARKING  # noqa: E402
from kombu_ladder.index import IndexStore  # noqa: E402
from kombu_ladder.parking import PARKED_ID  # noqa: E402
from kombu_ladder.producer import LadderProducer  # noqa: E402
from kombu_ladder.simulator import SimulatedBroker  # noqa: E402
from kombu_ladder.topology import declare  # noqa: E402
from kombu_ladder.web import Auth, ConsoleOptions  # noqa: E402
from kombu_ladder.web.app import HEADERS, SESSION_COOKIE, create_app  # noqa: E402
from kombu_ladder.web.console import Console  # noqa: E402

SECRET = "correct horse battery staple"
PAGES = ("/", "/waiting", "/parked", "/actions", "/bulk-cancel?task=billing.send")


class World:
    """A simulated broker with indexed Celery-like tasks and plain messages carrying the hostile strings, parked
    messages whose reasons are hostile too, and a console over it (refreshed by hand: no thread runs)."""

    def __init__(self, tmp: Path, counters: Any = None, **options: Any) -> None:
        self.broker = SimulatedBroker()
        self.connection = self.broker.connection()
        declare(self.connection)
        self.tasks = [f"task-{i}" for i in range(5)]
        self.hostile_ids = [f"m-{i}-{text[:40]}" for i, text in enumerate(MARKUP) if "\x00" not in text]
        channel = self.connection.channel()
        producer = LadderProducer(channel, index=True)
        for i, task_id in enumerate(self.tasks):
            producer.publish(json.dumps([[i, MARKUP[i % len(MARKUP)]], {"why": MARKUP[0]}, {}]),
                             exchange="", routing_key="celery", countdown=600 + i * 60, serializer=None,
                             content_type="application/json", content_encoding="utf-8",
                             headers={"task": "billing.send", "id": task_id, "eta": "2026-12-06T00:00:00+00:00",
                                      "argsrepr": MARKUP[1]},
                             correlation_id=task_id)
        for i, ident in enumerate(self.hostile_ids):
            producer.publish(MARKUP[i].encode(), exchange=MARKUP[i][:200], routing_key=MARKUP[-1], countdown=5000,
                             message_id=ident, content_type="text/plain", content_encoding="utf-8",
                             headers={"x-evil": MARKUP[i], MARKUP[i][:100]: "name"})
        for i, reason in enumerate(MARKUP[:4]):
            channel.basic_publish(channel.prepare_message(MARKUP[i].encode(), headers={
                PARKED_REASON: reason, PARKED_ID: f"p-{i}-{reason[:20]}", "task": MARKUP[i]}),
                exchange="", routing_key=PARKING)
        channel.close()
        self.console = Console(self.connection, options=ConsoleOptions(refresh=1.0, **options),
                               index_path=str(tmp / "index.sqlite"), counters=counters)
        self.store = IndexStore(self.console.index.path)
        self.refresh()
        self.client = TestClient(create_app(self.console))

    def refresh(self) -> None:
        self.console.refresh(self.store)
        self.console.sampler.sample()
        assert self.console.index.error is None, self.console.index.error

    def csrf(self, path: str) -> str:
        page = self.client.get(path)
        assert page.status_code == 200, page.text
        found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
        assert found, page.text
        return found.group(1)

    def close(self) -> None:
        self.client.close()
        self.store.close()
        self.console.stop()

    def looked(self, ident: str) -> Any:
        """Look for ``ident`` in the queues and wait for the answer (a page waits only a moment, then reloads)."""
        look = self.console.look(ident, wait=30)
        assert look.done
        return look


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def test_every_page_renders_with_the_safety_headers(world: World) -> None:
    for path in (*PAGES, f"/message?id={world.tasks[0]}", f"/confirm/cancel?id={world.tasks[0]}"):
        page = world.client.get(path)
        assert page.status_code == 200, (path, page.text)
        for name, value in HEADERS.items():
            assert page.headers[name] == value
        assert "script-src" not in HEADERS["Content-Security-Policy"]  # default-src 'none': no script at all
    overview = world.client.get("/").text
    assert "acemq.schedule.10m" in overview and "<svg" in overview
    assert re.search(r"<strong>\d+</strong> message\(s\) waiting", overview)


def test_the_waiting_list_pages_and_filters(world: World) -> None:
    listing = world.client.get("/waiting?task=billing.send").text
    for task_id in world.tasks:
        assert f"/message?id={task_id}" in listing
    assert "1–5 of 5" in listing
    assert "Cancel all 5" in listing
    assert "/message?id=task-" not in world.client.get("/waiting?task=other").text
    bad = world.client.get("/waiting?due_before=someday")
    assert bad.status_code == 400 and "due_before:" in bad.text
    found = world.client.get(f"/waiting?id={world.tasks[2]}").text
    assert found.count("/message?id=") == 1


def test_a_message_page_shows_where_it_waits_and_its_args(world: World) -> None:
    world.looked(world.tasks[1])
    page = world.client.get(f"/message?id={world.tasks[1]}").text
    assert "acemq.schedule.10m" in page
    assert "celery" in page and "<h4>args</h4>" in page
    assert "x-schedule-due-at" in page
    assert '<dt>state</dt><dd class="state-waiting">waiting</dd>' in page


def test_a_message_page_shows_a_cancelled_message_that_still_waits_as_cancelled(world: World) -> None:
    """Issue 40: the look into the queues said nothing of a cancellation (the index's row did)."""
    ident = world.tasks[3]
    cancel_many(world.connection, [ident], key="task_id")
    assert world.looked(ident).state == "cancelled"
    page = world.client.get(f"/message?id={ident}").text
    assert '<dt>state</dt><dd class="state-cancelled">cancelled</dd>' in page


@pytest.mark.parametrize("path,field,source", [
    *((page, None, None) for page in PAGES), ("/message", "id", "ids"), ("/waiting", "task", "markup"),
    ("/waiting", "id", "ids"), ("/confirm/cancel", "id", "ids"), ("/confirm/replay", "reason", "markup"),
    ("/bulk-cancel", "task", "markup"), ("/confirm/reschedule", "when", "markup"),
])
def test_the_hostile_corpus_renders_inert(world: World, path: str, field: str, source: str) -> None:
    values = {None: [None], "ids": world.hostile_ids, "markup": MARKUP}[source]
    for value in values:
        if path == "/message":
            assert world.looked(value).seen is not None  # the page shows its headers and body
        page = world.client.get(path, params={field: value, "id": value or "x"} if field else None)
        # A form field carries a value back as it is (the id to act on, the filter typed): escaped for HTML, its
        # characters unchanged. Everything shown as text has its control and bidi characters made visible too.
        lowered = re.sub(r'value="[^"]*"', "", page.text).lower()
        for sign in MARKUP_SIGNS:
            assert sign.lower() not in lowered, (path, value, sign)
    waiting = world.client.get("/waiting").text
    assert "&lt;script&gt;window.ladderPwned = 1&lt;/script&gt;" in waiting
    parked = world.client.get("/parked").text
    assert "&lt;script&gt;window.ladderPwned = 1&lt;/script&gt;" in parked
    assert "\\u202eevil" in world.client.get(f"/message?id={world.hostile_ids[7]}").text
    assert "{{ 7 * 7 }}" in world.client.get(f"/message?id={world.hostile_ids[5]}").text  # not evaluated: no 49


def test_no_action_without_the_csrf_token(world: World) -> None:
    ident = world.tasks[0]
    world.csrf(f"/confirm/cancel?id={ident}")  # a session cookie, but no token in the form
    for form in ({"id": ident}, {"id": ident, "csrf": ""}, {"id": ident, "csrf": "0" * 64}):
        refused = world.client.post("/act/cancel", data=form)
        assert refused.status_code == 403 and "CSRF" in refused.text
    token = world.csrf(f"/confirm/cancel?id={ident}")
    world.client.cookies.clear()
    refused = world.client.post("/act/cancel", data={"id": ident, "csrf": token})  # the token without its session
    assert refused.status_code == 403
    assert not world.console.recent
    world.refresh()
    assert [r.state for r in world.console.find(ident)] == ["waiting"]


def test_no_action_from_another_origin(world: World) -> None:
    token = world.csrf(f"/confirm/cancel?id={world.tasks[0]}")
    refused = world.client.post("/act/cancel", data={"id": world.tasks[0], "csrf": token},
                                headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403 and not world.console.recent


def test_no_state_change_by_get(world: World) -> None:
    for path in ("/act/cancel", "/act/run-now"):
        assert world.client.get(f"{path}?id={world.tasks[0]}").status_code == 405
    world.client.get(f"/confirm/cancel?id={world.tasks[0]}")
    assert not world.console.recent


def test_cancel_records_a_cancellation_the_index_then_shows(world: World) -> None:
    ident = world.tasks[0]
    token = world.csrf(f"/confirm/cancel?id={ident}")
    done = world.client.post("/act/cancel", data={"id": ident, "csrf": token})
    assert done.status_code == 200 and "The broker confirmed 1 cancellation record(s)" in done.text
    world.refresh()
    assert [r.state for r in world.console.find(ident)] == ["cancelled"]
    assert "cancel" in world.client.get("/actions").text


def test_reschedule_and_run_now_move_the_message(world: World) -> None:
    ident = world.tasks[3]
    confirm = world.client.get(f"/confirm/reschedule?id={ident}&when=%2B2h").text
    due = re.search(r'name="due_ms" value="(\d+)"', confirm)
    assert due and int(due.group(1)) == world.console.now_ms() + 7_200_000
    token = world.csrf(f"/confirm/reschedule?id={ident}&when=%2B2h")
    done = world.client.post("/act/reschedule", data={"id": ident, "due_ms": due.group(1), "csrf": token})
    assert done.status_code == 200 and "Found in acemq.schedule.10m" in done.text, done.text
    assert world.console.moved[ident] == int(due.group(1))
    assert world.looked(ident).seen.queue == "acemq.schedule.due"  # the copy waits in the control queue now
    token = world.csrf(f"/confirm/run-now?id={world.tasks[4]}")
    ran = world.client.post("/act/run-now", data={"id": world.tasks[4], "csrf": token})
    assert ran.status_code == 200 and "Ran now" in ran.text
    missing = world.client.post("/act/run-now", data={"id": "no-such-task", "csrf": token})
    assert missing.status_code == 409 and "nothing was moved" in missing.text


def test_bulk_cancel_previews_then_cancels(world: World) -> None:
    preview = world.client.get("/bulk-cancel?task=billing.send").text
    assert "This would cancel <strong>5</strong>" in preview
    assert world.client.get("/bulk-cancel").text.count('id="confirm"') == 0  # no filter, no button
    token = world.csrf("/bulk-cancel?task=billing.send")
    done = world.client.post("/act/bulk-cancel", data={"task": "billing.send", "expected": "5", "csrf": token})
    assert done.status_code == 200 and "The broker confirmed 5 cancellation record(s)" in done.text
    world.refresh()
    assert {r.state for t in world.tasks for r in world.console.find(t)} == {"cancelled"}
    refused = world.client.post("/act/bulk-cancel", data={"csrf": token})
    assert refused.status_code == 400


def test_replay_one_a_group_and_delete_one(world: World) -> None:
    parked = world.console.parked()
    assert len(parked) == 4
    token = world.csrf(f"/confirm/replay?parked_id={parked[0].parked_id}")
    done = world.client.post("/act/replay", data={"parked_id": parked[0].parked_id, "csrf": token})
    assert done.status_code == 200 and "The broker confirmed 1 copy(ies)" in done.text
    done = world.client.post("/act/replay", data={"reason": parked[1].reason, "csrf": token})
    assert "The broker confirmed 1 copy(ies)" in done.text
    done = world.client.post("/act/discard", data={"parked_id": parked[2].parked_id, "csrf": token})
    assert done.status_code == 200 and "it is gone" in done.text
    again = world.client.post("/act/discard", data={"parked_id": parked[2].parked_id, "csrf": token})
    assert again.status_code == 409
    assert [p.parked_id for p in world.console.parked()] == [parked[3].parked_id]


def test_read_only_has_no_action_at_all(tmp_path: Path) -> None:
    w = World(tmp_path, read_only=True)
    try:
        for path in ("/", "/waiting", "/parked", f"/message?id={w.tasks[0]}"):
            page = w.client.get(path)
            assert page.status_code == 200
            assert "/confirm/" not in page.text and "<form method=\"post\"" not in page.text
            assert "read-only" in page.text
        for path in ("/confirm/cancel?id=x", "/bulk-cancel?task=billing.send", "/actions"):
            assert w.client.get(path).status_code == 404
        for action in ("cancel", "run-now", "reschedule", "bulk-cancel", "replay", "discard"):
            assert w.client.post(f"/act/{action}", data={"id": w.tasks[0]}).status_code in (404, 405)
        assert not w.console.recent
    finally:
        w.close()


@pytest.mark.parametrize("auth", [Auth(password=SECRET), Auth(token=SECRET), Auth(password=SECRET, token=SECRET)])
def test_a_non_loopback_console_admits_only_credentials(tmp_path: Path, auth: Auth) -> None:
    w = World(tmp_path, host="0.0.0.0", auth=auth)
    try:
        for path in ("/", "/waiting", "/static/console.css", "/confirm/cancel?id=x"):
            refused = w.client.get(path)
            assert refused.status_code == 401 and SESSION_COOKIE not in refused.headers.get("set-cookie", "")
            assert refused.headers["WWW-Authenticate"]
            assert w.client.get(path, headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
        assert w.client.post("/act/cancel", data={"id": w.tasks[0]}).status_code == 401
        good = (f"Bearer {SECRET}" if auth.token else
                "Basic " + base64.b64encode(f"admin:{SECRET}".encode()).decode())
        assert w.client.get("/", headers={"Authorization": good}).status_code == 200
    finally:
        w.close()


def test_a_non_loopback_console_without_credentials_does_not_start() -> None:
    with pytest.raises(ValueError, match="--host 0.0.0.0 is not a loopback address"):
        ConsoleOptions(host="0.0.0.0")


def test_a_message_page_does_not_wait_for_a_long_look(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A look into a deep queue runs in the background: the page is served at once, says so, and reloads (no
    script: a meta refresh) until the look is done."""
    release = threading.Event()
    look = world.console._look
    monkeypatch.setattr(world.console, "_look", lambda ident, due: (release.wait(30), look(ident, due))[1])
    ident = world.tasks[2]
    page = world.client.get(f"/message?id={ident}").text
    assert 'id="looking"' in page and 'http-equiv="refresh" content="1"' in page
    assert "billing.send" in page  # what the index knows is there already
    release.set()
    assert world.looked(ident).seen is not None
    page = world.client.get(f"/message?id={ident}").text
    assert 'id="looking"' not in page and "http-equiv" not in page and "<h4>args</h4>" in page


def test_the_overview_shows_the_relays_counters_and_who_did_not_answer(tmp_path: Path) -> None:
    answers = {"w1@host": {"relay": True, "delivered": 7, "cancelled": 1}, MARKUP[0]: {"error": MARKUP[1]}}
    w = World(tmp_path, counters=lambda: answers)
    try:
        page = w.client.get("/").text
        assert "w1@host" in page and "<th class=\"num\">delivered</th>" in page and ">7</td>" in page
        assert "&lt;script&gt;" in page and "<script" not in page
        answers.clear()
        w.refresh()
        assert "No relay answered." in w.client.get("/").text
    finally:
        w.close()


def test_a_relay_that_cannot_be_polled_is_said_so(tmp_path: Path) -> None:
    def failing() -> Any:
        raise TimeoutError("no reply within 1 s")

    w = World(tmp_path, counters=failing)
    try:
        assert "The relays' counters could not be read: no reply within 1 s" in w.client.get("/").text
    finally:
        w.close()
