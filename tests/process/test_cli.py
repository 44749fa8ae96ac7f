"""The command lines: declare, status, a relay stopped by SIGTERM and SIGINT, and every error as one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import celery_ladder_cli, list_consumers, vhost_url, wait_for
from kombu import Connection, Producer, Queue

from kombu_ladder import Scheduler, declare
from kombu_ladder.brokers import DEFAULT_BROKER, UnsupportedBroker, require_rabbitmq
from kombu_ladder.brokers import broker_url as resolve_broker
from kombu_ladder.cli import main
from kombu_ladder.contract import (
    CONTROL,
    DUE_AT,
    PARKED_REASON,
    PARKING,
    TARGET_EXCHANGE,
    TARGET_ROUTING_KEY,
    rung_names,
)
from kombu_ladder.plan import HOLD_BYTES, delay_seconds
from kombu_ladder.relay.holder import GUESS_BYTES
from kombu_ladder.simulator import SimulatedBroker

#: Each test runs a command line or a build in a process of its own (see setup.cfg's markers).
pytestmark = pytest.mark.process

VENV_BIN = Path(sys.executable).parent
UNREACHABLE = "amqp://guest:guest@127.0.0.1:1//"


def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m kombu_ladder ARGS`` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "kombu_ladder", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def cli(broker_url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run("--broker", broker_url, *args, timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert the command failed with ``code`` and exactly one line on stderr, no traceback; return the line."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""
    return lines[0]


@pytest.mark.parametrize("given", [
    "amqp://guest:guest@localhost//", "amqps://u:p@rabbit:5671/prod", "pyamqp://", "AMQP://host//",
    "ladder-sim://localhost/sim-1", "amqp://a//;amqp://b//", "amqp", "pyamqp",
])
def test_rabbitmq_and_simulator_urls_are_accepted(given: str) -> None:
    require_rabbitmq(given)


@pytest.mark.parametrize("given,transport", [
    ("redis://localhost:6379/0", "redis"), ("memory://", "memory"), ("sqs://", "sqs"),
    ("sqla+postgresql://db/x", "sqla"), ("amqp://a//;redis://b", "redis"),
])
def test_other_transports_are_refused_naming_them(given: str, transport: str) -> None:
    with pytest.raises(UnsupportedBroker, match=f"not {transport}://: it is built on RabbitMQ's queue TTLs"):
        require_rabbitmq(given)


@pytest.mark.parametrize("given", ["notaurl", "localhost", "rabbit-1:5672"])
def test_a_broker_that_is_no_url_is_named_as_such(given: str) -> None:
    with pytest.raises(UnsupportedBroker) as raised:
        require_rabbitmq(given)
    assert str(raised.value).startswith(f"'{given}' is not a broker URL: ")
    assert "amqp://guest:guest@localhost//" in str(raised.value) and f"{given}://" not in str(raised.value)


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "memory://"])
@pytest.mark.parametrize("command", ["status", "declare", "relay"])
def test_a_non_rabbitmq_broker_is_one_usage_line(url: str, command: str) -> None:
    line = one_line_error(run(command, "--broker", url), 2)
    assert line.startswith("Error: the ladder needs RabbitMQ") and url.split(":")[0] + "://" in line


def test_the_simulator_url_is_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    broker = SimulatedBroker()
    try:
        assert main(["declare", "--broker", broker.url]) == 0
        assert capsys.readouterr().out.split() == [*rung_names(), CONTROL]
        assert set(broker.queue_names()) >= {*rung_names(), CONTROL, PARKING}
    finally:
        broker.close()


def test_a_simulator_url_alone_makes_its_broker_in_a_fresh_process() -> None:
    done = run("declare", "--broker", "ladder-sim://nobody")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [*rung_names(), CONTROL]


def test_replay_with_a_negative_limit_is_a_usage_error() -> None:
    line = one_line_error(run("replay", "--limit", "-1", "--broker", UNREACHABLE), 2)
    assert line == ("Error: Invalid value for '--limit': -1 is not in the range 1<=x<=1000000000. "
                    "(see 'python -m kombu_ladder replay --help')")


@pytest.mark.parametrize("args", [["relay", "--prefetch", "0"], ["relay", "--max-delay", "0"],
                                  ["status", "--parked", "-3"], ["move", "--to", "amqp://x//", "--limit", "0"],
                                  ["status", "--nope"],
                                  ["nope"], ["--log-level", "LOUD", "status"]])
def test_bad_options_are_one_usage_line(args: list[str]) -> None:
    line = one_line_error(run(*args), 2)
    assert line.startswith("Error: ") and "--help')" in line


@pytest.mark.parametrize("args,option", [
    (["relay", "--hold-window", "nan"], "--hold-window"), (["relay", "--max-delay", "1e400"], "--max-delay"),
    (["relay", "--max-delay", "nan"], "--max-delay"), (["relay", "--report-every", "nan"], "--report-every"),
    (["relay", "--metrics-port", "0", "--metrics-interval", "nan"], "--metrics-interval"),
])
def test_a_number_no_option_can_take_is_one_line_in_a_process_of_its_own(args: list[str], option: str) -> None:
    """The inputs that printed a traceback (or were taken silently), as a user types them; the full table of
    every numeric option of both command lines is tests/unit/test_cli_options.py."""
    line = one_line_error(run(*args, "--broker", UNREACHABLE), 2)
    assert line.startswith(f"Error: Invalid value for '{option}': ") and "not a finite number" in line


@pytest.mark.celery
@pytest.mark.parametrize("value,shown", [("nan", "nan is not a finite number"),
                                         ("1e9", "1e9 is not in the range 0<x<=600")])
def test_celery_ladder_status_timeout_is_finite_and_bounded(value: str, shown: str) -> None:
    line = one_line_error(celery_ladder_cli(UNREACHABLE, "status", "--timeout", value), 2)
    assert line == f"Error: Invalid value for '--timeout': {shown}. (see 'python -m celery ladder status --help')"


def test_version() -> None:
    from kombu_ladder import __version__

    done = run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kombu-ladder {__version__}\n", "")


def test_help_describes_every_command_without_markup() -> None:
    top = run("--help")
    assert top.returncode == 0, top.stderr
    assert "``" not in top.stdout and ":ref:" not in top.stdout
    assert "kombu-ladder status --broker amqp://" in top.stdout and "kombu-ladder --broker amqp://" in top.stdout
    for command in ("declare", "status", "replay", "move", "relay"):
        assert command in top.stdout
    relay = run("relay", "--help")
    assert relay.returncode == 0, relay.stderr
    assert "Run a relay on --broker until SIGTERM or SIGINT" in relay.stdout
    for option in ("--broker URL", "--log-level", "--prefetch", "--max-delay", "--report-every", "--allow-exchange"):
        assert option in relay.stdout


def test_unreachable_broker_is_one_line_with_exit_69() -> None:
    line = one_line_error(run("status", "--broker", UNREACHABLE), 69)
    assert line.startswith("Error: Could not connect to the message broker at amqp://guest:**@127.0.0.1:1//.")
    assert line.endswith("Reason: [Errno 111] Connection refused")


@pytest.mark.broker
def test_a_wrong_password_is_one_line_with_exit_69(broker_url: str) -> None:
    wrong = broker_url.replace("guest:guest@", "guest:not-the-password@")
    line = one_line_error(run("status", "--broker", wrong), 69)
    assert line.startswith("Error: Could not connect to the message broker")
    assert "ACCESS_REFUSED" in line and "not-the-password" not in line


@pytest.mark.broker
@pytest.mark.parametrize("order", ["broker first", "broker after the command"])
def test_the_broker_option_goes_before_or_after_the_command(connection: Connection, broker_url: str,
                                                             order: str) -> None:
    declare(connection)
    args = ["--broker", broker_url, "status"] if order == "broker first" else ["status", "--broker", broker_url]
    done = run(*args, KOMBU_LADDER_BROKER=UNREACHABLE)
    assert done.returncode == 0, done.stderr
    assert status_rows(done.stdout)[CONTROL] == ("0", "0")


@pytest.mark.broker
def test_the_environment_names_the_broker_and_the_option_overrides_it(connection: Connection,
                                                                      broker_url: str) -> None:
    assert run("status", KOMBU_LADDER_BROKER=broker_url).returncode == 0
    one_line_error(run("--broker", UNREACHABLE, "status", KOMBU_LADDER_BROKER=broker_url), 69)
    # Given twice, the one after the command wins.
    assert run("--broker", UNREACHABLE, "status", "--broker", broker_url).returncode == 0


@pytest.mark.parametrize("given,environ,expected", [
    (None, {}, (DEFAULT_BROKER, "default")),
    (None, {"CELERY_BROKER_URL": "amqp://c//"}, ("amqp://c//", "CELERY_BROKER_URL")),
    (None, {"CELERY_BROKER_URL": "amqp://c//", "KOMBU_LADDER_BROKER": "amqp://k//"},
     ("amqp://k//", "KOMBU_LADDER_BROKER")),
    (None, {"CELERY_BROKER_URL": "amqp://c//", "KOMBU_LADDER_BROKER": ""}, ("amqp://c//", "CELERY_BROKER_URL")),
    ("amqp://b//", {"CELERY_BROKER_URL": "amqp://c//", "KOMBU_LADDER_BROKER": "amqp://k//"},
     ("amqp://b//", "--broker")),
])
def test_the_broker_is_the_option_then_the_ladders_variable_then_celerys(given: Any, environ: dict[str, str],
                                                                         expected: tuple[str, str]) -> None:
    assert resolve_broker(given, environ) == expected


@pytest.mark.broker
def test_in_a_celery_project_the_cli_talks_to_celery_broker_url_and_says_so(connection: Connection,
                                                                            broker_url: str) -> None:
    env = {name: value for name, value in os.environ.items() if name != "KOMBU_LADDER_BROKER"}
    done = subprocess.run([sys.executable, "-m", "kombu_ladder", "status", "--log-level", "INFO"],
                          capture_output=True, text=True, timeout=60, env={**env, "CELERY_BROKER_URL": broker_url})
    assert done.returncode == 0, done.stderr
    vhost = broker_url.rsplit("/", 1)[1]
    assert re.search(rf"broker amqp://guest:\*+@127\.0\.0\.1:\d+/{re.escape(vhost)} \(from CELERY_BROKER_URL\)",
                     done.stderr), done.stderr
    assert "guest:guest" not in done.stderr
    # The ladder's own variable comes first, then CELERY_BROKER_URL.
    one_line_error(run("status", KOMBU_LADDER_BROKER=UNREACHABLE, CELERY_BROKER_URL=broker_url), 69)


@pytest.mark.broker
def test_status_into_a_closed_pipe_exits_quietly(connection: Connection, broker_url: str) -> None:
    """``kombu-ladder status | head -0``: no BrokenPipeError, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "kombu_ladder", "status", "--broker", broker_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader has gone before the first line is written
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err == ""


@pytest.mark.broker
def test_declare_prints_the_queue_names(connection: Connection, broker_url: str) -> None:
    done = cli(broker_url, "declare")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "acemq.schedule.1h", "acemq.schedule.10m", "acemq.schedule.1m", "acemq.schedule.10s",
        "acemq.schedule.1s", "acemq.schedule.due",
    ]


def status_rows(output: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in output.splitlines():
        match = re.match(r"^(acemq\.schedule\.\S+)\s+(\S+)\s+(\S+)\s*$", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


@pytest.mark.broker
def test_status_prints_depths_and_consumers(connection: Connection, broker_url: str) -> None:
    with Scheduler.on(connection, relay=False) as sched:
        sched.in_(3600, b"a", routing_key="t.status")
        sched.in_(7200, b"b", routing_key="t.status")
        sched.in_(30, b"c", routing_key="t.status")
    producer = Producer(connection.default_channel)
    for reason in ("unroutable: NO_ROUTE (a)", "malformed: no due-at", "unroutable: NO_ROUTE (a)"):
        producer.publish(b"p", exchange="", routing_key="acemq.schedule.parked", headers={PARKED_REASON: reason})
    consumer_channel = connection.channel()
    Queue("acemq.schedule.due", no_declare=True).bind(consumer_channel).consume(no_ack=False)
    try:
        done = cli(broker_url, "status")
    finally:
        consumer_channel.close()
    assert done.returncode == 0, done.stderr
    rows = status_rows(done.stdout)
    assert rows == {
        "acemq.schedule.1h": ("2", "0"),
        "acemq.schedule.10m": ("0", "0"),
        "acemq.schedule.1m": ("0", "0"),
        "acemq.schedule.10s": ("1", "0"),
        "acemq.schedule.1s": ("0", "0"),
        "acemq.schedule.due": ("0", "1"),
        "acemq.schedule.parked": ("3", "0"),
    }
    assert TALLY in done.stdout


@pytest.mark.broker
@pytest.mark.parametrize("args,printed,logged", [
    (["cancel", "id-1", "id-2"], "recorded a cancellation for 2 id(s) in ladder.cancellations",
     "recorded a cancellation for id 'id-1'"),
    (["replay"], "replayed 0 parked message(s) to acemq.schedule.due; 0 left parked",
     "replayed 0 parked message(s) to acemq.schedule.due"),
])
def test_a_command_prints_its_result_once(fresh_vhost: str, args: list[str], printed: str, logged: str) -> None:
    """The result on stdout, and no INFO log line saying it again on stderr (unless --log-level INFO asks)."""
    url = vhost_url(fresh_vhost)
    done = cli(url, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(printed) and done.stdout.count("\n") == 1, done.stdout
    assert done.stderr == ""
    loud = cli(url, "--log-level", "INFO", *args)
    assert loud.returncode == 0 and loud.stdout == done.stdout
    assert "INFO kombu_ladder" in loud.stderr and logged in loud.stderr, loud.stderr


#: What both status commands print for the three parked messages above.
TALLY = "why they are parked (the first 3):\n      2  unroutable: NO_ROUTE (a)\n      1  malformed: no due-at\n"


@pytest.mark.broker
@pytest.mark.celery
def test_celery_ladder_status_prints_the_same_tables_and_tally(connection: Connection, broker_url: str) -> None:
    producer = Producer(connection.default_channel)
    for reason in ("unroutable: NO_ROUTE (a)", "malformed: no due-at", "unroutable: NO_ROUTE (a)"):
        producer.publish(b"p", exchange="", routing_key=PARKING, headers={PARKED_REASON: reason})
    kombu = cli(broker_url, "status")
    celery = celery_ladder_cli(broker_url, "status", "--timeout", "0.2")
    assert kombu.returncode == 0 and celery.returncode == 0, (kombu.stderr, celery.stderr)
    assert TALLY in celery.stdout
    assert celery.stdout.startswith(kombu.stdout)  # then the workers' table
    tally = json.loads(celery_ladder_cli(broker_url, "status", "--json", "--timeout", "0.2").stdout)
    assert tally["parked_reasons"] == [
        {"reason": "unroutable: NO_ROUTE (a)", "count": 2}, {"reason": "malformed: no due-at", "count": 1}]


@pytest.mark.celery
def test_celery_ladder_status_without_a_broker_says_so_as_celery_does() -> None:
    line = one_line_error(celery_ladder_cli(UNREACHABLE, "status"), 69)
    # Celery's own commands (``celery inspect``) print "Error: Could not connect to the message broker. ..."
    assert line.startswith("Error: Could not connect to the message broker at amqp://guest:**@127.0.0.1:1//.")


@pytest.mark.celery
@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "memory://"])
def test_celery_ladder_refuses_a_non_rabbitmq_broker_in_one_line(url: str) -> None:
    assert one_line_error(celery_ladder_cli(url, "status"), 2).startswith("Error: the ladder needs RabbitMQ")


@pytest.mark.broker
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_relay_runs_relays_and_stops_cleanly(connection: Connection, broker_url: str, rabbit_vhost: str,
                                             tmp_path: Path, signum: int) -> None:
    log = tmp_path / "relay.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kombu_ladder", "relay", "--broker", broker_url, "--report-every", "1"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(lambda: "relay consuming from acemq.schedule.due" in log.read_text(), 30,
                 message="the relay subprocess to start consuming")
        # Only the ladder's queues: a Celery test earlier in the session may leave a result
        # consumer (rpc:// reply queue) in the shared session vhost.
        ladder = {*rung_names(), CONTROL, PARKING}
        assert [c for c in list_consumers(rabbit_vhost) if c["queue_name"] in ladder] == [
            # the contract's 50 for hops, plus room for the messages it holds: before it has seen one, as
            # many as its byte budget holds of 1 MiB messages (kombu_ladder.relay.holder.Holder.room)
            {"queue_name": "acemq.schedule.due", "prefetch_count": 50 + HOLD_BYTES // GUESS_BYTES,
             "ack_required": True},
        ]
        target = Queue("t.cli", durable=True).bind(connection.default_channel)
        target.declare()
        target.purge()
        with Scheduler.on(connection, relay=False) as sched:
            sched.in_(1.2, b"via the cli relay", routing_key="t.cli")
        message: Any = wait_for(lambda: target.get(no_ack=True), 20, message="the relayed message")
        assert message.body == b"via the cli relay"
        wait_for(lambda: "'delivered': 1" in log.read_text(), 10, message="a periodic counters line")
        started = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == 0, log.read_text()
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert f"received {signal.Signals(signum).name}, stopping the relay" in text
    assert re.search(r"relay stopped: \{'received': 1, 'delivered': 1, 'hops': 0, 'malformed': 0, 'parked': 0, "
                     r"'refused': 0, 'cancelled': 0\}", text), text
    assert "Traceback" not in text


def test_console_script_is_installed() -> None:
    script = VENV_BIN / "kombu-ladder"
    assert script.exists(), f"{script} is missing: is the package installed (pip install -e .)?"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for word in ("declare", "relay", "status", "--broker"):
        assert word in done.stdout


@pytest.mark.parametrize("given,shown", [(9e8, "countdown=900000000s"), (3.2e8 + 0.5, "countdown=320000000.5s")])
def test_a_too_long_countdown_is_shown_in_plain_digits(given: float, shown: str) -> None:
    with pytest.raises(ValueError) as error:
        delay_seconds(given, argument="countdown")
    assert str(error.value).startswith(f"{shown} is longer than the maximum")
    assert "e+" not in str(error.value)


@pytest.mark.broker
def test_relay_max_delay_parks_a_message_due_further_ahead(connection: Connection, broker_url: str,
                                                            tmp_path: Path) -> None:
    declare(connection)
    parking = Queue(PARKING, durable=True).bind(connection.default_channel)
    parking.purge()
    log = tmp_path / "relay.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "kombu_ladder", "relay", "--broker", broker_url,
                                 "--max-delay", "60"], stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: "relay consuming from acemq.schedule.due" in log.read_text(), 30,
                 message="the relay subprocess to start consuming")
        due = int(time.time() * 1000) + 2 * 3600 * 1000  # within the default ten years, past --max-delay 60
        Producer(connection.default_channel).publish(
            b"two hours ahead", exchange="", routing_key=CONTROL, serializer=None, delivery_mode=2,
            headers={TARGET_EXCHANGE: "", TARGET_ROUTING_KEY: "t.cli.max-delay", DUE_AT: due})
        parked: Any = wait_for(lambda: parking.get(no_ack=True), 20, message="the parked message")
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert parked.body == b"two hours ahead"
    assert "max_delay of 60s" in parked.headers[PARKED_REASON], parked.headers[PARKED_REASON]
