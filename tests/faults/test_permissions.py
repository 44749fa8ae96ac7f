"""A producer and a relay running as users with exactly the documented minimal permissions."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import amqp
import pytest
from helpers import queue_depth as depth
from kombu import Connection, Exchange, Queue

from kombu_ladder import LadderProducer
from kombu_ladder.cli import main as kombu_ladder
from kombu_ladder.contract import PARKING
from kombu_ladder.parking import parked_reasons
from kombu_ladder.permissions import operator, producer, relay

from .conftest import PrivateNode, RelayProcess
from .faultkit import take_figures, wait_until

pytestmark = pytest.mark.broker

BILLING = "billing"
OTHER = "other"


@pytest.fixture
def users(private_node: PrivateNode, fault_vhost: str) -> Iterator[dict[str, str]]:
    """A producer, a relay and an operator user on the test vhost, each with its minimal permissions."""
    suffix = uuid.uuid4().hex[:6]
    roles = {"producer": producer([BILLING, OTHER]), "relay": relay([BILLING]), "operator": operator([BILLING])}
    names = {}
    for role, perms in roles.items():
        user = f"ladder-{role}-{suffix}"
        private_node.ctl("add_user", user, "secret")
        private_node.ctl("set_permissions", "-p", fault_vhost, user, *perms.as_args())
        names[role] = user
    try:
        yield names
    finally:
        for user in names.values():
            private_node.ctl("delete_user", user, check=False)


def test_minimal_permissions_are_enough(private_node: PrivateNode, fault_vhost: str, fault_url: str,
                                        users: dict[str, str], tmp_path: Any, report: dict[str, Any]) -> None:
    with Connection(fault_url) as admin:  # the application's own topology, declared by its owner
        for name in (BILLING, OTHER):
            exchange = Exchange(name, type="direct", durable=True)
            exchange(admin.default_channel).declare()
            Queue(f"{name}.q", exchange, routing_key="invoice.due", durable=True)(admin.default_channel).declare()

    # The operator declares the ladder: the producer may not (it configures nothing).
    assert kombu_ladder(["--broker", private_node.url(fault_vhost, users["operator"], "secret"), "declare"]) == 0
    relay_process = RelayProcess(private_node.url(fault_vhost, users["relay"], "secret"), tmp_path,
                                 "--allow-exchange", BILLING)
    relay_process.start()
    try:
        with Connection(private_node.url(fault_vhost, users["producer"], "secret")) as conn:
            ladder = LadderProducer(conn.default_channel, serializer="json")
            for n in range(10):
                ladder.publish({"n": n}, exchange=BILLING, routing_key="invoice.due", countdown=1.5 + n / 10)
            for n in range(2):  # the producer may schedule for "other"; the relay may not deliver there
                ladder.publish({"n": n}, exchange=OTHER, routing_key="invoice.due", countdown=1.2)
        with Connection(fault_url) as admin:
            wait_until(lambda: depth(admin, f"{BILLING}.q") >= 10 and depth(admin, PARKING) >= 2, 30,
                       "deliveries to billing and two refusals parked", lambda: relay_process.log()[-3000:])
            assert depth(admin, f"{OTHER}.q") == 0
            figures = take_figures(admin, f"{BILLING}.q", 10)
        assert relay_process.alive(), relay_process.log()[-3000:]
        assert "ACCESS_REFUSED" not in relay_process.log()

        # The operator role can read why they were parked.
        with Connection(private_node.url(fault_vhost, users["operator"], "secret")) as conn:
            reasons = dict(parked_reasons(conn))
        assert reasons and all(r.startswith("refused: target exchange 'other'") for r in reasons)
    finally:
        relay_process.stop()

    # The permissions are really that narrow: the relay's user cannot publish to "other" itself.
    with Connection(private_node.url(fault_vhost, users["relay"], "secret")) as conn:
        channel = conn.channel()
        with pytest.raises(amqp.exceptions.AccessRefused):
            channel.basic_publish(amqp.Message(b"x"), exchange=OTHER, routing_key="invoice.due")
            # A round trip that needs no permission (from RabbitMQ 4.2.6 a passive declare does: it would be
            # refused whatever the publish did), to receive the asynchronous refusal.
            channel.basic_qos(0, 0, False)
    report.update(figures, sent=12, refused_and_parked=2)
    assert figures == {"sent": 10, "delivered": 10, "duplicated": 0, "lost": 0}


def test_a_relay_whose_user_may_not_read_the_cancellations_still_relays(
        private_node: PrivateNode, fault_vhost: str, fault_url: str, tmp_path: Any) -> None:
    """A user set up before cancellations existed (no ladder.cancellations): relaying goes on, unenforced."""
    user = f"ladder-old-relay-{uuid.uuid4().hex[:6]}"
    old = relay([BILLING])
    perms = [p.replace(r"|ladder\.cancellations", "") for p in old.as_args()]
    assert all("cancellations" not in p for p in perms)
    private_node.ctl("add_user", user, "secret")
    private_node.ctl("set_permissions", "-p", fault_vhost, user, *perms)
    with Connection(fault_url) as admin:
        exchange = Exchange(BILLING, type="direct", durable=True)
        exchange(admin.default_channel).declare()
        Queue(f"{BILLING}.q", exchange, routing_key="invoice.due", durable=True)(admin.default_channel).declare()
        admin.default_channel.queue_purge(f"{BILLING}.q")
    relay_process = RelayProcess(private_node.url(fault_vhost, user, "secret"), tmp_path, "--allow-exchange", BILLING)
    relay_process.start()
    try:
        with Connection(fault_url) as conn:
            ladder = LadderProducer(conn.default_channel, serializer="json")
            for n in range(5):
                ladder.publish({"n": n}, exchange=BILLING, routing_key="invoice.due", countdown=1.2)
        with Connection(fault_url) as admin:
            wait_until(lambda: depth(admin, f"{BILLING}.q") >= 5, 30, "deliveries by a relay without the stream",
                       lambda: relay_process.log()[-3000:])
            assert take_figures(admin, f"{BILLING}.q", 5) == {"sent": 5, "delivered": 5, "duplicated": 0, "lost": 0}
        assert relay_process.alive(), relay_process.log()[-3000:]
        assert "relaying WITHOUT enforcing them" in relay_process.log()
    finally:
        relay_process.stop()
        private_node.ctl("delete_user", user, check=False)


def test_a_producer_with_the_canceller_role_records_a_cancellation(private_node: PrivateNode, fault_vhost: str) -> None:
    from kombu_ladder import cancel
    from kombu_ladder.permissions import canceller, union

    user = f"ladder-canceller-{uuid.uuid4().hex[:6]}"
    assert kombu_ladder(["--broker", private_node.url(fault_vhost), "declare"]) == 0  # the operator's part
    private_node.ctl("add_user", user, "secret")
    private_node.ctl("set_permissions", "-p", fault_vhost, user, *union(producer([BILLING]), canceller()).as_args())
    try:
        with Connection(private_node.url(fault_vhost, user, "secret")) as conn:
            cancel(conn, "order-17")  # returns once the broker confirmed the record
            channel = conn.channel()
            with pytest.raises(amqp.exceptions.AccessRefused):  # and it cannot read the stream
                channel.basic_consume("ladder.cancellations", callback=lambda m: None,
                                      arguments={"x-stream-offset": "first"})
                channel.queue_declare("ladder.cancellations", passive=True)
    finally:
        private_node.ctl("delete_user", user, check=False)
