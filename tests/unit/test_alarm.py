"""The relay's Alarm keeps one timer entry pending, however many messages it holds."""

from __future__ import annotations

from typing import Callable

from kombu_ladder.relay.holder import Alarm


class Entry:
    def __init__(self, at: float, callback: Callable[[], None]) -> None:
        self.at, self.callback, self.cancelled = at, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimer:
    """A driver's timer on a clock the test moves: entries fire in due order when the clock passes them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.entries: list[Entry] = []

    def schedule(self, seconds: float, callback: Callable[[], None]) -> Entry:
        entry = Entry(self.now + seconds, callback)
        self.entries.append(entry)
        return entry

    def live(self) -> list[Entry]:
        return [e for e in self.entries if not e.cancelled]

    def advance(self, seconds: float) -> None:
        until = self.now + seconds
        while True:
            due = sorted((e for e in self.live() if e.at <= until), key=lambda e: e.at)
            if not due:
                self.now = until
                return
            self.entries.remove(due[0])
            self.now = max(self.now, due[0].at)
            due[0].callback()


def make(timer: FakeTimer, fires: list[float]) -> Alarm:
    return Alarm(timer.schedule, lambda: fires.append(timer.now), lambda: timer.now)


def test_later_requests_add_no_entry() -> None:
    timer, fires = FakeTimer(), []
    alarm = make(timer, fires)
    for seconds in (5.0, 6.0, 5.0, 9.0, 7.5):
        alarm(seconds)
    assert [e.at for e in timer.live()] == [1005.0]
    assert alarm.pending == 1005.0


def test_an_earlier_request_replaces_the_pending_entry() -> None:
    timer, fires = FakeTimer(), []
    alarm = make(timer, fires)
    alarm(5.0)
    alarm(2.0)
    assert [e.at for e in timer.live()] == [1002.0]
    timer.advance(10)
    assert fires == [1002.0]  # the replaced entry does not fire the relay again


def test_a_stale_entry_that_fires_anyway_is_ignored() -> None:
    """A timer that cannot cancel (the entry object has no cancel()) still fires the relay once."""
    entries: list[tuple[float, Callable[[], None]]] = []
    fires: list[str] = []
    now = [0.0]
    alarm = Alarm(lambda seconds, callback: entries.append((seconds, callback)), lambda: fires.append("fire"),
                  lambda: now[0])
    alarm(5.0)
    alarm(1.0)
    for _, callback in sorted(entries, key=lambda e: e[0]):
        callback()
    assert fires == ["fire"]


def test_ringing_clears_so_the_relay_can_ask_again_even_for_the_same_time() -> None:
    """A timer that fires a little early: the relay finds nothing due and asks for the remainder."""
    timer, fires = FakeTimer(), []
    alarm = Alarm(timer.schedule, lambda: (fires.append(timer.now), alarm(0.001) if len(fires) == 1 else None),
                  lambda: timer.now)
    alarm(1.0)
    timer.advance(1.0)
    assert alarm.pending == timer.now + 0.001
    timer.advance(0.001)
    assert len(fires) == 2 and alarm.pending is None


def test_entries_stay_bounded_while_many_messages_are_held_and_fired() -> None:
    """The mechanism behind seconds-late tasks in a worker: one request per held message and per fire."""
    timer, fires = FakeTimer(), []
    due = sorted(timer.now + 0.5 + i * 0.013 for i in range(500))
    held = list(due)

    def fire() -> None:
        fires.append(timer.now)
        while held and held[0] <= timer.now:
            held.pop(0)
        if held:
            alarm(held[0] - timer.now)

    alarm = Alarm(timer.schedule, fire, lambda: timer.now)
    for at in reversed(due):  # each is the new earliest when added
        alarm(at - timer.now)
        assert len(timer.live()) == 1
    peak = 0
    while held:
        timer.advance(0.01)
        peak = max(peak, len(timer.live()))
    assert peak <= 1
    assert len(fires) <= len(due)


def test_cancel_removes_the_pending_entry() -> None:
    timer, fires = FakeTimer(), []
    alarm = make(timer, fires)
    alarm(3.0)
    alarm.cancel()
    assert timer.live() == [] and alarm.pending is None
    timer.advance(5)
    assert fires == []
