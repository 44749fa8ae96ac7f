"""The control plane: its table of streams and record exchanges, one codec, one reader and one writer."""

from __future__ import annotations

from .table import (
    ADOPTED,
    ADOPTIONS,
    CANCEL,
    CANCELLATIONS,
    ENTRY,
    INDEX,
    KINDS,
    MARKER,
    NAMES,
    PROBE_KEY,
    READ_PREFETCH,
    READ_TIMEOUT,
    SEAL,
    SNAPSHOT,
    SNAPSHOT_ARGUMENTS,
    SNAPSHOTS,
    STREAM_ARGUMENTS,
    STREAMS,
    Kind,
    Stream,
    accepts,
    declare_control_plane,
    is_control_plane,
    kind,
    pattern,
)

__all__ = ["CANCELLATIONS", "INDEX", "ADOPTIONS", "SNAPSHOTS", "STREAM_ARGUMENTS", "SNAPSHOT_ARGUMENTS", "Stream",
           "Kind", "STREAMS", "KINDS", "CANCEL", "ENTRY", "ADOPTED", "SNAPSHOT", "SEAL", "MARKER", "NAMES", "kind",
           "is_control_plane", "accepts", "pattern", "PROBE_KEY", "READ_PREFETCH", "READ_TIMEOUT",
           "declare_control_plane"]
