"""The web console in a browser (headless Chromium, driven by Playwright), against a real ``-P ladder`` worker.

Tasks are scheduled through the ladder with the index on; ``celery ladder web`` runs as a user runs it. In the
browser: find one task and reschedule it to five seconds from now, run another now, cancel a third, replay a
parked task; each outcome is then checked on the broker and in the worker. The hostile corpus's markup, in a
waiting task's arguments and headers, must render as text and run nothing. A screenshot of each page goes
into docs/_static/console/ (docs/web.rst shows them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from celery.utils.time import maybe_iso8601
from helpers import IN_CI, ladder_counters, purge_ladder, queue_depth, wait_for
from hostile_corpus import MARKUP
from kombu import Connection, Exchange, Queue

import celery_ladder
from kombu_ladder.contract import PARKING
from kombu_ladder.rescheduling import reschedule

from .recording import purge_queues
from .test_celery_pool_cli import HERE, Worker
from .webapp import WEB_QUEUE, make_app

pytestmark = [pytest.mark.broker, pytest.mark.celery]

# A virtualenv without the web extra (the Celery matrix's: [celery,test,django]) has no console to test; one with
# it (make install) must have Playwright and Chromium too, or the test fails under CI.
pytest.importorskip("starlette", reason="the web extra is not installed in this virtualenv")

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "_static" / "console"
#: Debian's package (.ci/run installs it): Playwright drives it, and downloads no browser of its own.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
#: Where a parked task was meant to go: an exchange that does not exist until the test declares it.
MISSING = "web.missing"
#: Generous deadlines: a loaded two-core machine; every wait is on a condition.
DEADLINE = 60.0
#: How many times a screenshot is asked of Chromium before its refusal fails the test.
CAPTURES = 3
#: Resolves once the page has painted the next two frames.
NEXT_FRAME = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


def shot(page: Any, name: str, *, full_page: bool = False) -> None:
    """Save a screenshot as docs/_static/console/NAME.png, whole or not at all: CI runs this test in two lanes of
    one checkout at once while ``make docs`` copies the pictures, so each is written aside and renamed into place."""
    from playwright.sync_api import Error as PlaywrightError

    final = SHOTS / f"{name}.png"
    aside = final.with_name(f".{name}.{os.getpid()}.png")
    page.wait_for_load_state()
    for attempt in range(1, CAPTURES + 1):
        try:
            page.screenshot(path=str(aside), full_page=full_page)
            break
        except PlaywrightError as exc:
            # Chromium now and then refuses one capture on a loaded machine ("Unable to capture screenshot": CI's
            # rabbit4 lane, 2026-12-06) and takes the same picture when asked again after the next frame.
            if "Unable to capture screenshot" not in str(exc) or attempt == CAPTURES:
                raise
            page.evaluate(NEXT_FRAME)
    os.replace(aside, final)


def _playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if IN_CI:
            pytest.fail("Playwright is not installed (the webtest extra; make install installs it)", pytrace=False)
        pytest.skip("Playwright is not installed (pip install '.[webtest]')")
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("chromium is not installed (.ci/run installs Debian's)", pytrace=False)
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConsoleProcess:
    """``celery -A webapp ladder web`` on a free port of 127.0.0.1."""

    def __init__(self, broker_url: str, tmp: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "console.log"
        self.out = self.log.open("w")
        env = dict(os.environ, LADDER_POOL_BROKER=broker_url,
                   PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "webapp", "ladder", "web", "--port", str(self.port),
             "--refresh", "1", "--index", str(tmp / "index.sqlite")],
            cwd=HERE, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    def serving(self) -> bool:
        assert self.proc.poll() is None, self.output()
        try:
            with urllib.request.urlopen(self.url + "/", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    output = Worker.output  # the same log file and process attributes: read and stopped the same way
    stop = Worker.stop


@pytest.fixture(scope="module")
def publisher(broker_url: str) -> Iterator[Any]:
    with Connection(broker_url) as conn:
        purge_ladder(conn)
        purge_queues(broker_url, (WEB_QUEUE,))
        with conn.channel() as channel:
            Exchange(MISSING, channel=channel).delete()  # a previous run declared it
    app = celery_ladder.install(make_app(broker_url))
    yield app
    app.close()


@pytest.fixture(scope="module")
def worker(broker_url: str, publisher: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    started = Worker(broker_url, tmp_path_factory.mktemp("web-worker"), app="webapp", queue=WEB_QUEUE)
    try:
        started.wait_relaying(publisher)
        yield started
    finally:
        assert started.stop() == 0, started.output()


@pytest.fixture(scope="module")
def console(broker_url: str, worker: Worker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    process = ConsoleProcess(broker_url, tmp_path_factory.mktemp("web-console"))
    try:
        wait_for(process.serving, DEADLINE, interval=0.2, message="the console to serve", on_timeout=process.output)
        yield process
    finally:
        assert process.stop() == 0, process.output()


def test_the_console_drives_the_ladder_in_a_browser(broker_url: str, publisher: Any, worker: Worker,
                                                    console: ConsoleProcess) -> None:
    sync_playwright = _playwright()
    when = publisher.tasks["webapp.when"]
    shown = when.apply_async((42, "invoice"), {"customer": "ACME"}, countdown=2 * 3600)
    ran_now = when.apply_async(("run me now",), countdown=2 * 3600)
    cancelled = when.apply_async(("cancel me",), countdown=2 * 3600)
    hostile = when.apply_async(tuple(MARKUP[:3]), {"why": MARKUP[0]}, countdown=3 * 3600,
                               headers={"x-evil": MARKUP[1]})
    # Others that fall due over the next hour and day, for the overview's charts (untouched by the test).
    for minutes in (3, 7, 8, 15, 22, 23, 24, 31, 40, 41, 52, 58, 95, 130, 150, 300, 420, 600, 1000):
        when.apply_async((minutes,), countdown=minutes * 60 + 30)
    # Through the 1s rung (a shorter countdown would be published to its missing exchange at once), then parked by
    # the worker's relay: the exchange does not exist.
    parked = when.apply_async(("parked",), countdown=3, exchange=MISSING, routing_key=WEB_QUEUE)
    with Connection(broker_url) as conn:
        wait_for(lambda: queue_depth(conn, PARKING) == 1, DEADLINE, interval=0.2, message="the task to be parked",
                 on_timeout=worker.output)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(DEADLINE * 1000)

            def visit(path: str) -> None:
                page.goto(console.url + path)
                assert page.evaluate("window.ladderPwned") is None, path  # nothing from a message ran

            def until_indexed(ident: str) -> None:
                """Reload the waiting list until the console's index has ``ident`` (it reads every second)."""
                def found() -> bool:
                    visit(f"/waiting?id={ident}")
                    return page.locator(f'a[href="/message?id={ident}"]').count() == 1
                wait_for(found, DEADLINE, interval=0.5, message=f"{ident} in the console's index")

            def confirm(expected: str) -> str:
                page.click("#confirm")
                outcome = page.locator("#outcome").inner_text()
                assert expected in outcome, page.locator("main").inner_text()
                return page.locator("main").inner_text()

            for task in (shown, ran_now, cancelled, hostile):
                until_indexed(task.id)

            # Overview (with the workers' counters, polled every second) and Waiting.
            def overview() -> bool:
                visit("/")
                return worker.hostname in page.locator("main").inner_text()
            wait_for(overview, DEADLINE, interval=0.5, message="the worker's counters on the overview")
            assert "acemq.schedule.1h" in page.locator("table.depths").inner_text()
            assert page.locator(".chart svg").count() == 2
            shot(page, "overview")
            visit("/waiting?task=webapp.when")
            assert page.locator("table.rows tbody tr").count() >= 4
            shot(page, "waiting")

            # The hostile task: its markup is text on every page that shows it, and nothing ran.
            visit(f"/message?id={hostile.id}")
            page.wait_for_selector("h3:text('Headers')")
            text = page.locator("main").inner_text()
            assert MARKUP[0] in text and MARKUP[1] in text, text
            assert page.locator("main script, main img, main svg").count() == 0

            # Find one task, look at it, reschedule it to five seconds from now.
            visit("/waiting")
            page.fill("input[name=id]", shown.id)
            page.click("form.filter button")
            page.click(f'a[href="/message?id={shown.id}"]')
            page.wait_for_selector("h3:text('Headers')")  # the page reloads itself until the look is done
            assert "acemq.schedule.1h" in page.locator("dl.facts").inner_text()
            assert '"ACME"' in page.locator("pre").nth(1).inner_text()  # the kwargs, decoded
            shot(page, "message", full_page=True)
            page.fill("input[name=when]", "+5s")
            asked = time.time()  # the confirmation page reads "+5s" from its own now, a little later
            page.click("form.inline button")
            page.wait_for_selector("#confirm")  # the confirmation page, loaded (the click only starts it)
            shot(page, "confirm")
            assert "The broker committed one transaction" in confirm("Rescheduled")

            # Run another now.
            visit(f"/message?id={ran_now.id}")
            page.click("text=Run now…")
            ran_at = time.time()
            assert "Found in acemq.schedule.1h" in confirm("Ran now")

            # Cancel a third.
            visit(f"/message?id={cancelled.id}")
            page.click("text=Cancel…")
            assert "The broker confirmed 1 cancellation record(s)" in confirm("Cancelled")

            # Parked: the route fixed, replay its group.
            with Connection(broker_url) as conn, conn.channel() as channel:
                Exchange(MISSING, "direct", durable=True, channel=channel).declare()
                Queue(WEB_QUEUE, Exchange(MISSING, "direct"), routing_key=WEB_QUEUE, channel=channel,
                      durable=True).declare()
            visit("/parked")
            assert "NOT_FOUND" in page.locator("main").inner_text()
            shot(page, "parked", full_page=True)
            page.click("text=Replay this group…")
            assert "The broker confirmed 1 copy(ies)" in confirm("Replayed 1")

            # The console's index learns of the cancellation.
            def shown_cancelled() -> bool:
                visit(f"/waiting?id={cancelled.id}")
                return "cancelled" in page.locator("table.rows").inner_text()
            wait_for(shown_cancelled, DEADLINE, interval=0.5, message="the cancellation in the console's index")
            visit("/actions")
            assert page.locator("table.rows tbody tr").count() == 4
        finally:
            browser.close()

    # In the worker and on the broker: the rescheduled task ran once, at its new time, with its eta moved.
    got = shown.get(timeout=DEADLINE)
    assert got["args"] == [42, "invoice"] and got["kwargs"] == {"customer": "ACME"}
    assert asked + 4.9 <= got["at"] <= asked + 5.0 + DEADLINE, got["at"] - asked
    assert abs(maybe_iso8601(got["eta"]).timestamp() - got["at"]) < 1.5, "its eta is the new time"
    now_got = ran_now.get(timeout=DEADLINE)
    assert now_got["at"] >= ran_at and now_got["args"] == ["run me now"]
    assert parked.get(timeout=DEADLINE)["args"] == ["parked"]
    with Connection(broker_url) as conn:
        assert queue_depth(conn, PARKING) == 0
        # The cancelled task: brought forward, the relay drops it instead of delivering it.
        before = ladder_counters(publisher, [worker.hostname])[worker.hostname]["cancelled"]
        moved = reschedule(conn, cancelled.id, 0.0)
        assert moved.found is not None and moved.found.queue == "acemq.schedule.1h"
    wait_for(lambda: ladder_counters(publisher, [worker.hostname])[worker.hostname]["cancelled"] > before,
             DEADLINE, interval=0.5, message="the worker's relay to drop the cancelled task")

    def runs(task_id: str) -> int:
        return sum(1 for line in worker.output().splitlines() if "succeeded" in line and task_id in line)

    wait_for(lambda: runs(shown.id) and runs(ran_now.id) and runs(parked.id), DEADLINE,
             message="the runs in the worker's log")
    assert (runs(shown.id), runs(ran_now.id), runs(parked.id), runs(cancelled.id)) == (1, 1, 1, 0)
    hostile.revoke()
