"""What each page shows, computed from plain values: filters, paging, rows, charts, groups (pure: no I/O).

Every string that came from a message (ids, names, headers, reasons) stays plain text
here; the templates escape all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional, Sequence
from urllib.parse import urlencode

from ..contract import CONTROL, PARKING, RUNGS, describe, rung_name
from ..index.query import Filter, parse_when
from ..index.store import Row
from ..plan import choose_rung
from .preview import shown

__all__ = [
    "DEFAULT_TARGET", "iso", "ago", "FilterForm", "filter_form", "Page", "page_of", "WaitingRow", "waiting_row",
    "DepthRow", "depth_rows", "Bar", "Chart", "chart", "hour_chart", "day_chart", "CounterTable", "counter_table",
    "RELAY_COUNTERS", "relay_counters", "ParkedGroup", "parked_groups", "Outcome", "link",
]

#: How the form names the default exchange ("" in AMQP), since an empty field means "any".
DEFAULT_TARGET = "(default)"


def iso(ms: Optional[int]) -> str:
    """Epoch ms as a UTC time to the second: ``2026-12-06 03:00:00Z`` ("-" for None)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def ago(ms: Optional[int], now_ms: int) -> str:
    """How far ``ms`` is from now, as a person says it: ``in 4m 10s``, ``12s ago``."""
    if ms is None:
        return "-"
    delta = (ms - now_ms) / 1000
    seconds = abs(delta)
    if seconds < 60:
        text = f"{seconds:.0f}s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)}m {int(seconds % 60)}s"
    elif seconds < 86400:
        text = f"{int(seconds // 3600)}h {int(seconds % 3600 // 60)}m"
    else:
        text = f"{int(seconds // 86400)}d {int(seconds % 86400 // 3600)}h"
    return f"in {text}" if delta >= 0 else f"{text} ago"


def link(path: str, **params: Any) -> str:
    """``path`` with the parameters that are not None as its query string."""
    kept = {k: v for k, v in params.items() if v is not None and v != ""}
    return f"{path}?{urlencode(kept)}" if kept else path


@dataclass(frozen=True)
class FilterForm:
    """The waiting list's filter as the form gave it (``values``, shown back) and as the index reads it."""

    values: Mapping[str, str]
    found: Filter
    #: One line per field that could not be read, naming it.
    errors: tuple[str, ...] = ()
    #: An id to find instead of a listing.
    ident: Optional[str] = None

    @property
    def narrowed(self) -> bool:
        """Whether it names a task or a target (what a bulk cancel needs)."""
        return self.found.task is not None or self.found.exchange is not None or self.found.routing_key is not None

    def query(self, **extra: Any) -> dict[str, Any]:
        """The form's values as query parameters (for paging links), with ``extra``."""
        return {**{k: v for k, v in self.values.items() if v}, **extra}


FIELDS = ("id", "task", "target", "routing_key", "due_after", "due_before")


def filter_form(params: Mapping[str, str], now_ms: int) -> FilterForm:
    """Read the waiting list's query parameters: ``task``, ``target`` (``(default)`` is the default exchange),
    ``routing_key``, ``due_after`` and ``due_before`` (ISO 8601, UTC unless it says otherwise, or from now:
    ``+2h``, ``30m``), ``id``. An empty field is no filter."""
    values = {name: str(params.get(name, "")).strip() for name in FIELDS}
    errors = []
    when: dict[str, Optional[int]] = {}
    for name in ("due_after", "due_before"):
        when[name] = None
        if values[name]:
            try:
                when[name] = parse_when(values[name], option=name, now_ms=now_ms)
            except ValueError as exc:
                errors.append(str(exc))
    target = values["target"]
    found = Filter(due_before=when["due_before"], due_after=when["due_after"],
                   exchange="" if target == DEFAULT_TARGET else (target or None),
                   routing_key=values["routing_key"] or None, task=values["task"] or None)
    return FilterForm(values, found, tuple(errors), values["id"] or None)


@dataclass(frozen=True)
class Page:
    """One page of a listing: where it starts, how long it is, how many there are in all."""

    offset: int
    limit: int
    total: int

    @property
    def first(self) -> int:
        return min(self.offset + 1, self.total)

    @property
    def last(self) -> int:
        return min(self.offset + self.limit, self.total)

    @property
    def previous(self) -> Optional[int]:
        return max(0, self.offset - self.limit) if self.offset > 0 else None

    @property
    def next(self) -> Optional[int]:
        return self.offset + self.limit if self.offset + self.limit < self.total else None


def page_of(offset: Any, limit: int, total: int) -> Page:
    """The page at ``offset`` (a query parameter: anything not a whole number is 0), never past the end."""
    try:
        start = max(0, int(str(offset)))
    except ValueError:
        start = 0
    if total and start >= total:
        start = (total - 1) // limit * limit
    return Page(start, limit, total)


@dataclass(frozen=True)
class WaitingRow:
    """One entry of the index, as the waiting list shows it."""

    ident: Optional[str]
    message_id: Optional[str]
    task_id: Optional[str]
    task: str
    target: str
    due: str
    due_ms: int
    relative: str
    state: str
    size: int
    #: The rung it waits in now, by its due time (the queue itself is looked into on its page).
    rung: str


def rung_for(due_ms: int, now_ms: int) -> str:
    """The queue a message due at ``due_ms`` waits in now, by the plan: the largest rung that does not overshoot
    (the control queue or a relay's hand below a second)."""
    rung = choose_rung(due_ms - now_ms)
    return CONTROL if rung is None else rung_name(rung)


def target_text(exchange: str, routing_key: str) -> str:
    """A target as one line: ``(default) → invoices``."""
    return f"{shown(exchange, limit=255) or DEFAULT_TARGET} \u2192 {shown(routing_key, limit=255)}"


def waiting_row(row: Row, now_ms: int) -> WaitingRow:
    """A row of :meth:`~kombu_ladder.index.IndexStore.listing` for the page."""
    e = row.entry
    ident = e.task_id or e.message_id
    return WaitingRow(ident=ident, message_id=e.message_id, task_id=e.task_id, task=e.task or "-",
                      target=target_text(e.exchange, e.routing_key), due=iso(e.due), due_ms=e.due,
                      relative=ago(e.due, now_ms), state=row.state, size=e.size, rung=rung_for(e.due, now_ms))


@dataclass(frozen=True)
class DepthRow:
    """One ladder queue's depth for the overview."""

    queue: str
    label: str
    messages: Optional[int]
    consumers: Optional[int]
    #: The bar's width in percent of the deepest queue.
    width: float


def depth_rows(depths: Iterable[Any]) -> list[DepthRow]:
    """Rows of :class:`~kombu_ladder.depths.QueueDepth` (queue, messages, consumers) with bar widths."""
    rows = list(depths)
    deepest = max([d.messages or 0 for d in rows] + [1])
    out = []
    for d in rows:
        if d.queue == CONTROL:
            label = "control queue (relays consume it)"
        elif d.queue == PARKING:
            label = "parking queue"
        else:
            label = next((f"rung of {describe(r)}" for r in RUNGS if rung_name(r) == d.queue), d.queue)
        out.append(DepthRow(d.queue, label, d.messages, d.consumers, round(100.0 * (d.messages or 0) / deepest, 1)))
    return out


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    count: int
    label: str


@dataclass(frozen=True)
class Chart:
    """A server-drawn bar chart (the template writes it as SVG)."""

    title: str
    width: int
    height: int
    bars: tuple[Bar, ...]
    #: (x, text) of the axis labels.
    ticks: tuple[tuple[float, str], ...]
    total: int
    peak: int


#: The chart's drawing area, in SVG units; the bars leave room for the labels below.
CHART_WIDTH, CHART_HEIGHT, LABELS = 720, 140, 18


def chart(title: str, counts: Sequence[int], labels: Sequence[str], *, tick_every: int) -> Chart:
    """Bars of ``counts`` (one per label), the tallest full height; a label under every ``tick_every``-th bar."""
    n = max(1, len(counts))
    peak = max(list(counts) + [0])
    width = CHART_WIDTH / n
    plot = CHART_HEIGHT - LABELS
    bars = []
    for i, count in enumerate(counts):
        height = plot * count / peak if peak else 0.0
        if count and height < 1:
            height = 1.0  # one message is still visible
        bars.append(Bar(round(i * width + 0.5, 2), round(plot - height, 2), round(max(width - 1, 1), 2),
                        round(height, 2), count, labels[i]))
    ticks = tuple((round(i * width, 2), labels[i]) for i in range(0, len(counts), tick_every))
    return Chart(title, CHART_WIDTH, CHART_HEIGHT, tuple(bars), ticks, sum(counts), peak)


def hour_chart(counts: Sequence[int], start_ms: int) -> Chart:
    """What falls due in the next hour, by minute (``counts[i]``: minute ``i`` from ``start_ms``)."""
    labels = [datetime.fromtimestamp(start_ms / 1000 + 60 * i, tz=timezone.utc).strftime("%H:%M")
              for i in range(len(counts))]
    return chart("Falls due in the next hour, by minute (UTC)", counts, labels, tick_every=10)


def day_chart(counts: Sequence[int], start_ms: int) -> Chart:
    """What falls due in the next day, by hour (``counts[i]``: hour ``i`` from ``start_ms``)."""
    labels = [datetime.fromtimestamp(start_ms / 1000 + 3600 * i, tz=timezone.utc).strftime("%H:00")
              for i in range(len(counts))]
    return chart("Falls due in the next day, by hour (UTC)", counts, labels, tick_every=3)


@dataclass(frozen=True)
class CounterTable:
    """The relays' counters: one row per relay (worker), one column per counter."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[str, ...]], ...]
    #: Relays that answered with an error instead of counters: (name, error).
    errors: tuple[tuple[str, str], ...]


def counter_table(counters: Mapping[str, Mapping[str, Any]]) -> CounterTable:
    """``{relay: {counter: value}}`` (``celery inspect ladder``'s answer) as a table, columns in first-seen order."""
    columns: list[str] = []
    rows, errors = [], []
    for name, values in sorted(counters.items()):
        if "error" in values:
            errors.append((shown(name, limit=120), shown(values["error"])))
            continue
        for key in values:
            if key not in columns:
                columns.append(key)
    for name, values in sorted(counters.items()):
        if "error" not in values:
            rows.append((shown(name, limit=120), tuple(shown(values.get(c, "-"), limit=40) for c in columns)))
    return CounterTable(tuple(shown(c, limit=40) for c in columns), tuple(rows), tuple(errors))


#: The relay counters a ``/metrics`` page exports (``ladder_<name>_total``), in the order the overview shows them.
RELAY_COUNTERS = ("received", "delivered", "hops", "malformed", "parked", "refused", "cancelled")


def relay_counters(text: str) -> dict[str, Any]:
    """A relay's counters from its Prometheus ``/metrics`` text (``kombu-ladder relay --metrics-port``): each
    ``ladder_<counter>_total`` (``parked`` summed over its reasons), and ``cancellations`` (enforced or not) when
    exported. Lines that are not these are ignored; a value that is not a number is left out."""
    values: dict[str, float] = {}
    enforced: Optional[bool] = None
    for line in text.splitlines():
        if not line.startswith("ladder_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]  # the exposition format: name{labels} value
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        key = name[len("ladder_"):-len("_total")] if name.endswith("_total") else ""
        if name == "ladder_cancellations_enforced":
            enforced = value == 1
        elif key in RELAY_COUNTERS:
            values[key] = values.get(key, 0) + value
    out: dict[str, Any] = {"relay": True}
    if enforced is not None:
        out["cancellations"] = enforced
    out.update((key, int(values[key])) for key in RELAY_COUNTERS if key in values)
    return out


@dataclass(frozen=True)
class ParkedGroup:
    """The parked messages that share one reason."""

    reason: str
    messages: tuple[Any, ...]

    @property
    def count(self) -> int:
        return len(self.messages)

    @property
    def addressable(self) -> int:
        """How many have a parked id (can be replayed or deleted one by one)."""
        return sum(1 for m in self.messages if m.parked_id)


def parked_groups(parked: Iterable[Any]) -> list[ParkedGroup]:
    """:class:`~kombu_ladder.parking.Parked` messages grouped by reason, the largest group first."""
    groups: dict[str, list[Any]] = {}
    for message in parked:
        groups.setdefault(message.reason, []).append(message)
    return [ParkedGroup(reason, tuple(items))
            for reason, items in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


@dataclass(frozen=True)
class Outcome:
    """What an action did, as the broker confirmed it (``ok`` False: it did nothing, and says why)."""

    ok: bool
    title: str
    lines: tuple[str, ...] = ()
    #: When it was done (epoch ms), and the action's name (``cancel``, ``reschedule``...).
    at: int = 0
    action: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
