"""RabbitMQ-only helpers for tests: extra vhosts and reading queues back with rabbitmqctl."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any, Iterator
from urllib.parse import quote

import pytest

__all__ = ["fresh_vhost", "list_queues", "list_bindings", "list_exchanges", "list_consumers", "vhost_url", "drain"]


def _ctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=60)
    return done.stdout


def vhost_url(vhost: str) -> str:
    """Return the guest AMQP URL of ``vhost`` on the test broker."""
    from conftest import BROKER_HOST, BROKER_PORT

    return f"amqp://guest:guest@{BROKER_HOST}:{BROKER_PORT}/{quote(vhost, safe='')}"


@pytest.fixture
def fresh_vhost(rabbit_vhost: str) -> Iterator[str]:
    """A brand-new, empty vhost for one test (deleted afterwards)."""
    from conftest import temporary_vhost  # here: conftest is loaded by pytest first

    with temporary_vhost(f"{rabbit_vhost}-fresh-{uuid.uuid4().hex[:6]}") as vhost:
        yield vhost


def _json(*args: str) -> list[dict[str, Any]]:
    out = _ctl(*args, "--formatter", "json").strip()
    return json.loads(out) if out else []


def list_queues(vhost: str) -> dict[str, dict[str, Any]]:
    """Return ``{name: {"durable", "auto_delete", "exclusive", "arguments" (a dict)}}`` as the broker has them."""
    rows = _json("list_queues", "-p", vhost, "name", "durable", "auto_delete", "exclusive", "arguments")
    return {
        r["name"]: {
            "durable": r["durable"],
            "auto_delete": r["auto_delete"],
            "exclusive": r["exclusive"],
            "arguments": {k: v for k, _type, v in r["arguments"]},
        }
        for r in rows
    }


def list_exchanges(vhost: str) -> dict[str, dict[str, Any]]:
    """Return ``{name: {"type", "durable", "auto_delete", "arguments"}}``."""
    rows = _json("list_exchanges", "-p", vhost, "name", "type", "durable", "auto_delete", "arguments")
    return {r["name"]: {"type": r["type"], "durable": r["durable"], "auto_delete": r["auto_delete"],
                        "arguments": {k: v for k, _t, v in r["arguments"]}} for r in rows}


def list_bindings(vhost: str) -> set[tuple[str, str, str]]:
    """Return the ``(source exchange, destination queue, routing key)`` bindings of named exchanges."""
    rows = _json("list_bindings", "-p", vhost, "source_name", "destination_name", "destination_kind", "routing_key")
    return {(r["source_name"], r["destination_name"], r["routing_key"])
            for r in rows if r["source_name"] and r["destination_kind"] == "queue"}


def list_consumers(vhost: str) -> list[dict[str, Any]]:
    """Return the consumers of ``vhost``: ``queue_name``, ``prefetch_count``, ``ack_required``."""
    return _json("list_consumers", "-p", vhost, "queue_name", "prefetch_count", "ack_required")


def queue_depth(conn: Any, queue: str) -> int:
    """Ready messages in ``queue``, asked passively on a channel of its own."""
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue, passive=True)[1])
    finally:
        channel.close()


def drain(conn: Any, queue: str) -> list[Any]:
    """Take every message of ``queue`` (destructively), head first; return them (py-amqp messages)."""
    channel = conn.channel()
    messages = []
    try:
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            messages.append(message)
    finally:
        channel.close()
    return messages
