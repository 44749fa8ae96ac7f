"""The index of waiting work: entries producers append to ``ladder.index``, read into a local SQLite file."""

from __future__ import annotations

from .query import BY, Filter, parse_when
from .reader import INDEX_ENV, IndexUnavailable, SyncResult, default_path, sync
from .records import STREAM, Entry, IndexRecordError
from .store import IndexStore, Row, ids_of
from .writer import IndexRefused, IndexWriter, declare_index, open_index

__all__ = [
    "STREAM", "Entry", "IndexRecordError", "IndexWriter", "IndexRefused", "declare_index", "open_index",
    "IndexStore", "Row", "Filter", "BY",
    "ids_of", "parse_when", "sync", "SyncResult", "IndexUnavailable", "default_path", "INDEX_ENV",
]
