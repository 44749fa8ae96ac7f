"""The simulator against RabbitMQ: the same scenarios, the same assertions, on both backends."""

from __future__ import annotations

import re
import socket
import struct
import uuid
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from amqp.exceptions import ChannelError, PreconditionFailed
from backends import depth, get
from helpers import list_queues
from kombu import Connection, Exchange, Producer, Queue

from kombu_ladder import link, wire


def _names(*parts: str) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"fx.{tag}.{p}" for p in parts]


def _no_vhost(text: str) -> str:
    return re.sub(r"in vhost '[^']*'", "in vhost 'V'", text)


def _drain(conn: Connection) -> None:
    try:
        conn.drain_events(timeout=0.05)
    except socket.timeout:
        pass


def test_dead_lettering_writes_x_death_as_the_release_does(ladder_backend: Any) -> None:
    """3.10 writes ``x-death`` and ``x-first-death-*``; 4.x also ``x-last-death-*`` (measured on 4.0.5)."""
    src, dlx, q1, q2, q3 = _names("src", "dlx", "q1", "q2", "q3")
    with ladder_backend.connection() as conn:
        channel = conn.default_channel
        Exchange(src, "topic", durable=True)(channel).declare()
        dead = Exchange(dlx, "direct", durable=True)
        dead(channel).declare()
        Queue(q1, Exchange(src, "topic"), routing_key="a.*", queue_arguments={
            "x-message-ttl": 200, "x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "to2"})(channel).declare()
        Queue(q2, dead, routing_key="to2", queue_arguments={
            "x-message-ttl": 200, "x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "to3"})(channel).declare()
        Queue(q3, dead, routing_key="to3")(channel).declare()
        Producer(channel).publish(
            {"x": 1}, exchange=src, routing_key="a.b", expiration=0.1, priority=3, correlation_id="cid",
            headers={"h": 1, "big": 2**40, "f": 1.5, "b": b"xy", "l": [1, "a"]},
        )
        message = ladder_backend.wait_until(lambda: get(conn, q3), 10, "the twice dead-lettered message")

    headers = dict(message.headers)
    deaths = headers.pop("x-death")
    assert all(isinstance(d.pop("time"), datetime) for d in deaths)
    assert deaths == [
        {"count": 1, "exchange": dlx, "queue": q2, "reason": "expired", "routing-keys": ["to2"]},
        {"count": 1, "exchange": src, "original-expiration": "100", "queue": q1, "reason": "expired",
         "routing-keys": ["a.b"]},
    ]
    last = ({"x-last-death-exchange": dlx, "x-last-death-queue": q2, "x-last-death-reason": "expired"}
            if ladder_backend.release >= (4, 0) else {})
    assert headers == {"h": 1, "big": 2**40, "f": 1.5, "b": "xy", "l": [1, "a"],
                       "x-first-death-exchange": src, "x-first-death-queue": q1, "x-first-death-reason": "expired",
                       **last}
    assert "expiration" not in message.properties
    assert (message.properties["priority"], message.properties["correlation_id"]) == (3, "cid")
    assert (message.delivery_info["exchange"], message.delivery_info["routing_key"]) == (dlx, "to3")
    assert message.payload == {"x": 1}


def test_rejections_count_up_in_one_x_death_entry(ladder_backend: Any) -> None:
    dlx, queue = _names("dlx", "q")
    with ladder_backend.connection() as conn:
        channel = conn.default_channel
        dead = Exchange(dlx, "direct", durable=True)
        dead(channel).declare()
        Queue(queue, dead, routing_key=queue, queue_arguments={"x-dead-letter-exchange": dlx})(channel).declare()
        Producer(channel).publish(b"r", exchange=dlx, routing_key=queue)
        for count in range(1, 4):
            message = ladder_backend.wait_until(lambda: get(conn, queue, no_ack=False), 10, "the message")
            deaths = message.headers.get("x-death", [])
            assert [d["count"] for d in deaths] == ([count - 1] if count > 1 else [])
            message.reject()
        message = ladder_backend.wait_until(lambda: get(conn, queue), 10, "the message")
    (death,) = message.headers["x-death"]
    assert (death["count"], death["reason"], death["queue"], death["routing-keys"]) == (3, "rejected", queue, [queue])


def test_per_message_ttl_expires_only_at_the_head_of_the_queue(ladder_backend: Any) -> None:
    waiting, target = _names("waiting", "target")
    with ladder_backend.connection() as conn:
        channel = conn.default_channel
        Queue(target, durable=True)(channel).declare()
        Queue(waiting, durable=True, queue_arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": target})(channel).declare()
        producer = Producer(channel)
        start = ladder_backend.clock()
        producer.publish(b"long", routing_key=waiting, expiration=3)
        producer.publish(b"short", routing_key=waiting, expiration=0.1)
        seen: list[tuple[float, Any]] = []

        def both() -> bool:
            message = get(conn, target)
            if message is not None:
                seen.append((ladder_backend.clock() - start, message))
            return len(seen) == 2

        ladder_backend.wait_until(both, 15, "both messages")
    assert [m.body for _, m in seen] == [b"long", b"short"]
    # The 0.1 s message waited behind the 3 s one: this is the bug the ladder exists to avoid.
    assert seen[1][0] >= 3.0


def test_inequivalent_redeclaration_fails_with_rabbitmqs_text(ladder_backend: Any) -> None:
    """The texts are the same on 3.10, 4.0.5 and 4.3.6 (4.3 refuses a transient queue only when it is new)."""
    queue, exchange = _names("q", "x")
    with ladder_backend.connection() as conn:
        Queue(queue, durable=True, queue_arguments={"x-message-ttl": 1000})(conn.channel()).declare()
        Exchange(exchange, "topic", durable=True)(conn.channel()).declare()
        errors = []
        for declare in (
            lambda ch: Queue(queue, durable=True, queue_arguments={"x-message-ttl": 5})(ch).declare(),
            lambda ch: Queue(queue, durable=True)(ch).declare(),
            lambda ch: Queue(queue, durable=False, queue_arguments={"x-message-ttl": 1000})(ch).declare(),
            lambda ch: Exchange(exchange, "direct", durable=True)(ch).declare(),
            lambda ch: Queue(f"{queue}.bad", queue_arguments={"x-dead-letter-routing-key": "k"})(ch).declare(),
        ):
            with pytest.raises(PreconditionFailed) as failed:
                declare(conn.channel())
            assert failed.value.reply_code == 406
            errors.append(_no_vhost(failed.value.reply_text))
        # An argument RabbitMQ does not compare is accepted.
        Queue(queue, durable=True, queue_arguments={"x-message-ttl": 1000, "x-unknown": 1})(conn.channel()).declare()
    assert errors == [
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{queue}' in vhost 'V': "
        "received '5' but current is '1000'",
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{queue}' in vhost 'V': "
        "received none but current is the value '1000' of type 'signedint'",
        f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{queue}' in vhost 'V': "
        "received 'false' but current is 'true'",
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{exchange}' in vhost 'V': "
        "received 'direct' but current is 'topic'",
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{queue}.bad' in vhost 'V': "
        "routing_key_but_no_dlx_defined",
    ]


def test_a_mandatory_return_arrives_before_the_confirm_of_that_publish(ladder_backend: Any) -> None:
    (exchange,) = _names("x")
    with ladder_backend.connection() as conn:
        channel = conn.channel()
        Exchange(exchange, "direct", durable=True)(channel).declare()
        events: list[tuple[Any, ...]] = []
        channel.confirm_select()
        channel.events["basic_ack"].add(lambda tag, multiple: events.append(("ack", tag)))
        channel.events["basic_return"].add(
            lambda exc, ex, key, message: events.append(("return", exc.reply_code, exc.reply_text, ex, key,
                                                         message.body, message.properties["application_headers"])))
        message = channel.prepare_message(b"lost", 0, "application/data", "binary", {"k": "v"}, {})
        type(channel).basic_publish(channel, message, exchange=exchange, routing_key="nowhere", mandatory=True)
        message = channel.prepare_message(b"dropped", 0, "application/data", "binary", {}, {})
        type(channel).basic_publish(channel, message, exchange=exchange, routing_key="nowhere", mandatory=False)
        ladder_backend.wait_until(lambda: _drain(conn) or ("ack", 2) in events, 10, "the second confirm")
    assert events[0] == ("return", 312, "NO_ROUTE", exchange, "nowhere", b"lost", {"k": "v"})
    assert events[1][0] == "ack" and events[-1] == ("ack", 2)


def test_requeued_message_goes_back_to_its_place_marked_redelivered(ladder_backend: Any) -> None:
    (queue,) = _names("q")
    with ladder_backend.connection() as conn:
        channel = conn.default_channel
        Queue(queue, durable=True)(channel).declare()
        for body in (b"1", b"2", b"3"):
            Producer(channel).publish(body, routing_key=queue)
        first = ladder_backend.wait_until(lambda: get(conn, queue, no_ack=False), 10, "message 1")
        second = get(conn, queue, no_ack=False)
        assert (first.body, second.body, first.delivery_info["redelivered"]) == (b"1", b"2", False)
        second.requeue()
        first.requeue()
        again = [get(conn, queue, no_ack=False) for _ in range(3)]
        assert [(m.body, m.delivery_info["redelivered"]) for m in again] == [(b"1", True), (b"2", True), (b"3", False)]
        for message in again:
            message.ack()
        with pytest.raises(PreconditionFailed, match="unknown delivery tag"):
            channel.basic_ack(99)
            channel.queue_declare(queue=queue, passive=True)  # RabbitMQ reports it on the next call


def test_a_transaction_publishes_and_acks_together_at_commit_and_not_at_all_if_the_channel_closes(
        ladder_backend: Any) -> None:
    """What adoption relies on (issue 23): a copy and the ack of its original in one transaction."""
    source, target = _names("src", "dst")
    with ladder_backend.connection() as conn:
        setup = conn.default_channel
        for name in (source, target):
            Queue(name, durable=True)(setup).declare()
        for body in (b"1", b"2"):
            Producer(setup).publish(body, routing_key=source)
        for commit in (False, True):
            channel = conn.channel()
            channel.tx_select()
            original = ladder_backend.wait_until(partial(channel.basic_get, source, no_ack=False), 10, "a message")
            assert (original.body, original.delivery_info["redelivered"]) == (b"1", commit)
            Producer(channel).publish(b"copy of " + original.body, routing_key=target)
            channel.basic_ack(original.delivery_info["delivery_tag"])
            assert depth(conn, target) == 0, "nothing is published before the commit"
            if commit:
                channel.tx_commit()
            channel.close()  # without a commit: the publish is dropped and the original given back
        assert [m.body for m in iter(lambda: get(conn, target), None)] == [b"copy of 1"]
        assert [m.body for m in iter(lambda: get(conn, source), None)] == [b"2"]
        channel = conn.channel()
        channel.confirm_select()
        with pytest.raises(PreconditionFailed, match="cannot switch from confirm to tx mode"):
            channel.tx_select()


def _watched(channel: Any) -> Any:
    """The relay's guard on ``channel``: content properties kept as the bytes that arrived."""
    guard = link.link_for(channel).guard
    guard.watch(channel, lambda *close: None)
    return guard


#: Headers whose encoding RabbitMQ 4.x changes: names out of order, a repeated name, 64-bit integers
#: as py-amqp writes them (``L``), at the top and nested.
_TABLE = [(b"zz", b"L" + struct.pack(">q", -3)), (b"aa", b"A" + struct.pack(">I", 9) + b"L" + struct.pack(">q", 5)),
          (b"zz", b"S" + struct.pack(">I", 3) + b"dup"), (b"mm", b"I" + struct.pack(">i", 1))]


def test_returns_and_deliveries_carry_the_properties_as_the_release_encodes_them(ladder_backend: Any) -> None:
    """3.10 hands back the bytes as published; 4.x re-encodes the header table (``wire.normal_form``)."""
    (exchange, queue) = _names("x", "q")
    raw = wire.write_properties(wire.Properties(fields={"delivery_mode": 2, "message_id": b"m"}, headers=_TABLE))
    expected = raw if ladder_backend.release < (4, 0) else wire.normal_form(raw)
    assert expected is not None
    with ladder_backend.connection() as conn:
        channel = conn.channel()
        Exchange(exchange, "direct", durable=True)(channel).declare()
        Queue(queue, Exchange(exchange, "direct"), routing_key="here", durable=True)(channel).declare()
        guard = _watched(channel)
        returned: list[bytes] = []
        channel.events["basic_return"].add(lambda *args: returned.append(guard.take(channel) or b""))
        for routing_key in ("nowhere", "here"):
            link.publish(channel, link.RawMessage(b"body", raw), exchange, routing_key)
        ladder_backend.wait_until(lambda: _drain(conn) or returned, 10, "the return")
        delivered: list[bytes] = []
        channel.basic_consume(queue, callback=lambda message: delivered.append(guard.take(channel) or b""))
        ladder_backend.wait_until(lambda: _drain(conn) or delivered, 10, "the delivery")
    assert returned == [expected]
    assert delivered == [expected]


def test_queue_arguments_read_back_as_the_release_reports_them(ladder_backend: Any, request: Any) -> None:
    """4.x names ``x-queue-type`` on every queue read back, a classic one declared without it too."""
    (queue,) = _names("q")
    arguments = {"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "k"}
    with ladder_backend.connection() as conn:
        Queue(queue, durable=True, queue_arguments=arguments)(conn.default_channel).declare()
        if ladder_backend.name == "simulator":
            read = ladder_backend.broker.queue_arguments(queue)
        else:
            read = list_queues(request.getfixturevalue("rabbit_vhost"), as_declared=False)[queue]["arguments"]
        # A declaration with exactly the arguments that were given stays equivalent on every release.
        Queue(queue, durable=True, queue_arguments=arguments)(conn.default_channel).declare()
    extra = {"x-queue-type": "classic"} if ladder_backend.release >= (4, 0) else {}
    assert read == {**arguments, **extra}


def test_passive_declares_and_refusals_check_permissions_as_the_release_does(ladder_backend: Any,
                                                                              request: Any) -> None:
    """From 4.2.6 a passive declare needs a permission on what it names, before whether it exists (4.3.1 on:
    any right; refused naming configure); 3.x and 4.0 need none. 4.x texts name the right refused."""
    queue, exchange, missing = _names("q", "x", "gone")
    rights = dict(configure="^$", write=f"^{re.escape(exchange)}$|^{re.escape(queue)}$", read="^$")
    if ladder_backend.name == "simulator":
        setup, user = ladder_backend.connection, ladder_backend.connection
    else:
        from helpers import vhost_url

        from kombu_ladder.permissions import Permissions

        vhost = request.getfixturevalue("fresh_vhost")
        url = request.getfixturevalue("make_user")("passive", Permissions(**rights))
        setup, user = partial(Connection, vhost_url(vhost)), partial(Connection, url)
    with setup() as conn:
        Queue(queue, durable=True)(conn.default_channel).declare()
        Exchange(exchange, "direct", durable=True)(conn.default_channel).declare()
    if ladder_backend.name == "simulator":
        ladder_backend.broker.set_permissions(**rights)
    outcomes = []
    with user() as conn:
        for declare in (
            lambda ch: ch.queue_declare(queue, passive=True),  # write on it
            lambda ch: ch.exchange_declare(exchange, "direct", passive=True),  # write on it
            lambda ch: ch.queue_declare(missing, passive=True),  # no right
            lambda ch: ch.exchange_declare(missing, "direct", passive=True),  # no right
            lambda ch: ch.queue_declare(missing, durable=True),  # an active declare: configure
        ):
            try:
                declare(conn.channel())
                outcomes.append("ok")
            except ChannelError as exc:
                outcomes.append(f"{exc.reply_code} {_no_vhost(exc.reply_text)}")
    refused = "403 ACCESS_REFUSED - {}access to {} '{}' in vhost 'V' refused for user '{}'"
    user_name = ("guest" if ladder_backend.name == "simulator"
                 else re.sub(r"^amqp://([^:]+):.*", r"\1", url))
    named = "configure " if ladder_backend.release >= (4, 0) else ""
    if ladder_backend.release >= (4, 2, 6):
        missing_ones = [refused.format("configure ", "queue", missing, user_name),
                        refused.format("configure ", "exchange", missing, user_name)]
    else:
        missing_ones = [f"404 NOT_FOUND - no queue '{missing}' in vhost 'V'",
                        f"404 NOT_FOUND - no exchange '{missing}' in vhost 'V'"]
    assert outcomes == ["ok", "ok", *missing_ones, refused.format(named, "queue", missing, user_name)]
