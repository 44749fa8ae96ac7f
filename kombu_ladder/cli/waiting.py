"""``waiting find|list|count`` and bulk ``cancel --task/--target``: command bodies over the index."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from typing import Any, Callable, Optional, Sequence

import click

from ..cancellation.records import STREAM as CANCELLATIONS
from ..cancellation.stream import cancel_many
from ..index import BY, Filter, IndexStore, IndexUnavailable, Row, default_path, ids_of, sync
from ..index.query import hour_label
from ..index.records import STREAM as INDEX
from ..times import TIME_HELP, parse_when
from . import commands
from .commands import BadUsage, CommandError, emit
from .options import MANY, Number
from .options import shared_option as _option

__all__ = [
    "When", "index_option", "no_sync_option", "due_before_option", "due_after_option", "target_option",
    "routing_key_option", "task_option", "everything_option", "page_limit_option", "page_offset_option",
    "by_option", "dry_run_option", "open_index", "filter_of", "find", "listing", "count", "bulk_cancel",
    "row_fields", "check_cancel", "cancel",
]

I_SYNCED = ("index {path}: read {entries} new entr(y/ies) from {index} and {cancellations} cancellation(s) from "
            "{cancellations_stream} in {seconds:.2f} s{skipped}")
I_SKIPPED = "; skipped {} invalid record(s)"
E_NOT_FOUND = ("the index has no message with the id {ident!r}: it was not scheduled by a producer with the index on "
               "(index=True, ladder_index), or was due over a day ago. 'kombu-ladder find' looks into the queues "
               "themselves")
E_NO_FILTER = "bulk cancel needs --task or --target (with --routing-key): cancelling everything is not a bulk option"
E_IDS_AND_FILTER = "give ids, or --task/--target, not both"
I_WOULD = ("dry run: would cancel {n} waiting message(s) the index knows of; nothing was recorded. Messages from "
           "producers without the index, or from other AceMQ clients, are not in it")
I_BULK = ("recorded a cancellation for {n} id(s) in {stream} (the waiting messages the index knows of); every relay "
          "drops them at their next hop or delivery")
I_NOTHING = "no waiting message in the index matches: nothing to cancel"
I_NO_ID = "{} matching message(s) have neither a message id nor a task id: they cannot be cancelled by id"


class When(click.ParamType):
    """A time option, as epoch ms (:func:`kombu_ladder.times.parse_when`)."""

    name = "time"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_when(str(value), option=param.opts[0] if param is not None else "time",
                              now_ms=int(time.time() * 1000))
        except ValueError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)


#: ``--index PATH``.
index_option = _option("--index", "index_path", default=None, metavar="PATH",
                       help="The index file [default: $KOMBU_LADDER_INDEX, else one per broker and vhost under "
                            "~/.cache/kombu-ladder].")
#: ``--no-sync``.
no_sync_option = _option("--no-sync", is_flag=True,
                         help="Answer from the index file as it is, without reading the streams (no broker needed).")
due_before_option = _option("--due-before", type=When(), default=None, metavar="TIME",
                            help=f"Only messages due before TIME: {TIME_HELP}.")
due_after_option = _option("--due-after", type=When(), default=None, metavar="TIME",
                           help=f"Only messages due at or after TIME: {TIME_HELP}.")
target_option = _option("--target", default=None, metavar="EXCHANGE",
                        help="Only messages for this target exchange ('' is the default exchange).")
routing_key_option = _option("--routing-key", default=None, metavar="KEY",
                             help="Only messages for this routing key (the queue, on the default exchange).")
task_option = _option("--task", default=None, metavar="NAME", help="Only Celery tasks of this name.")
everything_option = _option("--all", "everything", is_flag=True,
                            help="Also what is no longer waiting: cancelled, or due already.")
page_limit_option = _option("--limit", type=Number(min=1, max=MANY, integer=True), default=50, show_default=True,
                            metavar="N", help="A page of at most N messages.")
page_offset_option = _option("--offset", type=Number(min=0, max=MANY, integer=True), default=0, show_default=True,
                             metavar="N", help="Skip the first N (0: the first page; --offset 50: the next one).")
by_option = _option("--by", type=click.Choice(BY), default=None, metavar="|".join(BY),
                    help="Count per hour they fall due in (UTC), per target, or per Celery task name.")
dry_run_option = _option("--dry-run", is_flag=True, help="Print what would be cancelled, and cancel nothing.")


def filter_of(*, due_before: Optional[int] = None, due_after: Optional[int] = None, target: Optional[str] = None,
              routing_key: Optional[str] = None, task: Optional[str] = None, everything: bool = False) -> Filter:
    """The options as a :class:`~kombu_ladder.index.Filter`."""
    return Filter(due_before=due_before, due_after=due_after, exchange=target, routing_key=routing_key, task=task,
                  everything=everything)


def open_index(url: str, path: Optional[str], connection: Any = None, *, timeout: float = 300.0) -> IndexStore:
    """The index file for the broker at ``url`` (or ``path``), brought up to date from ``connection`` if given
    (one line on stderr says what was read).

    Raises:
        CommandError: a stream could not be read to its end.
    """
    store = IndexStore(path or default_path(url))
    if connection is not None:
        try:
            result = sync(connection, store, timeout=timeout)
        except IndexUnavailable as exc:
            store.close()
            raise CommandError(str(exc)) from None
        click.echo(I_SYNCED.format(path=store.path, entries=result.entries, index=INDEX,
                                   cancellations=result.cancellations, cancellations_stream=CANCELLATIONS,
                                   seconds=result.seconds,
                                   skipped=I_SKIPPED.format(result.skipped) if result.skipped else ""), err=True)
    return store


def _iso(ms: int) -> str:
    stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def row_fields(row: Row) -> dict[str, Any]:
    """A row as JSON fields."""
    e = row.entry
    return {"message_id": e.message_id, "task_id": e.task_id, "task": e.task, "exchange": e.exchange,
            "routing_key": e.routing_key, "due": _iso(e.due), "due_ms": e.due, "published": _iso(e.at),
            "size": e.size, "state": row.state}


def _row_lines(row: Row, now_ms: int) -> list[str]:
    e = row.entry
    ahead = (e.due - now_ms) / 1000
    relative = f"in {ahead:.1f} s" if ahead >= 0 else f"{-ahead:.1f} s ago"
    lines = [f"{e.task_id or e.message_id or '(no id)'}: {row.state}",
             f"due        {_iso(e.due)}, {relative}",
             f"target     exchange {e.exchange!r}, routing key {e.routing_key!r}"]
    if e.task:
        lines.append(f"task       {e.task}[{e.task_id}]")
    if e.task_id and e.message_id and e.message_id != e.task_id:
        lines.append(f"message id {e.message_id}")
    lines.append(f"published  {_iso(e.at)}, {e.size} byte(s)")
    return lines


def find(store: IndexStore, ident: str, now_ms: int, *, as_json: bool = False) -> list[Row]:
    """Print every entry with the message id or task id ``ident`` (waiting, cancelled or due).

    Raises:
        CommandError: the index has none (exit status 1).
    """
    rows = store.find(ident, now_ms)
    if not rows:
        raise CommandError(E_NOT_FOUND.format(ident=ident))
    if as_json:
        emit(json.dumps({"found": [row_fields(r) for r in rows]}, indent=2, sort_keys=True))
        return rows
    for index, row in enumerate(rows):
        if index:
            emit()
        for line in _row_lines(row, now_ms):
            emit(line)
    return rows


_LIST_ROW = "{:<24} {:<9} {:<36} {:<28} {}"

#: On stderr after ``waiting list`` when the rungs hold more than the index knows of.
I_UNINDEXED = ("{n} message(s) wait in the ladder that the index does not list: only what producers with the index "
               "on scheduled is listed (LadderProducer(channel, index=True), Scheduler.on(connection, index=True), "
               "Celery's ladder_index = True); 'kombu-ladder status' shows the rung depths")


def unindexed(waiting_in_queues: int, store: IndexStore, now_ms: int) -> int:
    """How many of the ``waiting_in_queues`` messages (the rungs' and the control queue's depths) the index does
    not know of: those beyond its entries not due yet, cancelled or not (a cancelled one waits until a relay drops
    it). Messages a relay holds for their last seconds are in no queue, so this never overcounts them."""
    indexed = store.count(Filter(due_after=now_ms, everything=True), now_ms)[0][1]
    return max(0, waiting_in_queues - int(indexed))


def listing(store: IndexStore, found: Filter, now_ms: int, *, limit: int = 50, offset: int = 0,
            as_json: bool = False, waiting_in_queues: Optional[int] = None) -> list[Row]:
    """Print one page of the entries ``found`` covers, soonest due first; with ``waiting_in_queues`` (the ladder's
    queue depths), a line on stderr saying how many of those the index does not list, and how to list them."""
    rows = store.listing(found, now_ms, limit=limit, offset=offset)
    missing = unindexed(waiting_in_queues, store, now_ms) if waiting_in_queues is not None else 0
    if missing:
        click.echo(I_UNINDEXED.format(n=missing), err=True)
    if as_json:
        emit(json.dumps({"rows": [row_fields(r) for r in rows], "offset": offset, "limit": limit}, indent=2,
                        sort_keys=True))
        return rows
    emit(_LIST_ROW.format("due", "state", "id", "task", "target"))
    for row in rows:
        e = row.entry
        emit(_LIST_ROW.format(_iso(e.due), row.state, e.task_id or e.message_id or "-", e.task or "-",
                              f"{e.exchange or '(default)'} {e.routing_key}"))
    if len(rows) == limit:
        emit(f"(more may follow: --offset {offset + limit})")
    return rows


def _key_text(by: str, key: tuple[Any, ...]) -> str:
    if by == "due-hour":
        return hour_label(int(key[0]))
    if by == "target":
        return f"{key[0] or '(default)'} {key[1]}"
    return str(key[0]) if key[0] is not None else "(not a Celery task)"


def count(store: IndexStore, found: Filter, now_ms: int, *, by: Optional[str] = None, as_json: bool = False) -> Any:
    """Print how many entries ``found`` covers: the total, or one line per group of ``by``."""
    groups = store.count(found, now_ms, by=by)
    if as_json:
        emit(json.dumps({"by": by, "counts": [{"key": list(k), "count": n} for k, n in groups]}, indent=2,
                        sort_keys=True))
        return groups
    if by is None:
        emit(str(groups[0][1]))
        return groups
    for key, n in groups:
        emit(f"{n:>9}  {_key_text(by, key)}")
    emit(f"{sum(n for _, n in groups):>9}  total")
    return groups


def bulk_cancel(connection: Any, store: IndexStore, found: Filter, now_ms: int, *, dry_run: bool = False,
                cancel: Callable[..., int] = cancel_many) -> int:
    """Cancel every waiting message of the index that ``found`` covers (``--task``, ``--target``); return how many
    ids. With ``dry_run``, print them and what would be done, and record nothing.

    Raises:
        BadUsage: ``found`` names neither a task nor a target.
    """
    if found.task is None and found.exchange is None and found.routing_key is None:
        raise BadUsage(E_NO_FILTER)
    rows = store.listing(dataclasses.replace(found, everything=False), now_ms, limit=-1)
    by_task, by_message, unnamed = ids_of(rows)
    total = len(by_task) + len(by_message)
    if dry_run:
        for row in rows:
            e = row.entry
            if e.task_id or e.message_id:
                emit(f"{e.task_id or e.message_id}\t{_iso(e.due)}\t{e.task or '-'}\t"
                     f"{e.exchange or '(default)'}\t{e.routing_key}")
        emit(I_WOULD.format(n=total))
    elif total:
        if by_task:
            cancel(connection, by_task, key="task_id")
        if by_message:
            cancel(connection, by_message, key="message_id")
        emit(I_BULK.format(n=total, stream=CANCELLATIONS))
    else:
        emit(I_NOTHING)
    if unnamed:
        emit(I_NO_ID.format(unnamed))
    return total


def check_cancel(ids: Sequence[str], found: Filter, *, command: str) -> None:
    """Refuse a ``cancel`` with both ids and a filter, or neither, before connecting.

    Raises:
        BadUsage: naming what to give.
    """
    bulk = found.task is not None or found.exchange is not None or found.routing_key is not None
    if ids and (bulk or found.due_before is not None or found.due_after is not None):
        raise BadUsage(E_IDS_AND_FILTER)
    if not ids and not bulk:
        raise BadUsage(f"give the ids to cancel, or --task/--target (see '{command} --help')")


def cancel(connection: Any, ids: Sequence[str], found: Filter, *, url: str, index_path: Optional[str],
           now: Callable[[], int], dry_run: bool = False, key: str = "message_id") -> None:
    """``cancel``'s body: the ids given (``key`` says what they are), or in bulk the waiting ones of the index that
    ``found`` covers, read up to date first. With ``dry_run`` print them and record nothing."""
    if ids:
        if dry_run:
            for ident in ids:
                emit(ident)
            emit(f"dry run: would record a cancellation for {len(ids)} id(s); nothing was recorded")
            return
        commands.cancel(connection, list(ids), key=key)
        return
    store = open_index(url, index_path, connection)
    try:
        bulk_cancel(connection, store, found, now(), dry_run=dry_run)
    finally:
        store.close()
