"""Issue 28: the operator tools on the quorum profile: each command that declares or checks knows the profile.

``check``, ``declare``, ``replay``, ``move`` and ``relay`` (and ``celery ladder check|declare|relay``)
take ``--queue-type``, and without it use the profile the ladder is declared with, found by declaring
the first queue that exists as each profile declares it (RabbitMQ accepts only the matching one).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import celery_ladder_cli, list_queues, temporary_vhost, vhost_url, wait_for
from kombu import Connection

from kombu_ladder import LadderProducer, declare
from kombu_ladder.cli import main as kombu_ladder
from kombu_ladder.contract import CONTROL, PARKING, rung_name, rung_names
from kombu_ladder.topology import declared_queue_type

pytestmark = pytest.mark.broker


def operate(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    """``kombu-ladder --broker URL ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = kombu_ladder(["--broker", url, "--log-level", "WARNING", *args])
    out, err = capsys.readouterr()
    return code, out, err


def profiles(vhost: str) -> dict[str, Any]:
    """Each ladder queue's x-queue-type as the broker has it (absent: classic on 3.10)."""
    queues = list_queues(vhost)
    return {name: queues[name]["arguments"].get("x-queue-type", "classic") for name in [*rung_names(), CONTROL]
            if name in queues}


QUORUM = dict.fromkeys([*rung_names(), CONTROL], "quorum")
CLASSIC = dict.fromkeys([*rung_names(), CONTROL], "classic")


def test_the_declared_profile_is_found_and_nothing_is_created(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        assert declared_queue_type(conn) is None
        assert list_queues(fresh_vhost) == {}, "finding the profile creates nothing"
        declare(conn, queue_type="quorum")
        assert declared_queue_type(conn) == "quorum"
    with temporary_vhost(f"{fresh_vhost}-c") as other, Connection(vhost_url(other)) as conn:
        declare(conn)
        assert declared_queue_type(conn) == "classic"
        channel = conn.channel()
        channel.queue_delete(rung_name(3600))  # the first queue found is declared as neither profile
        channel.queue_declare(rung_name(3600), durable=True, auto_delete=False, arguments={"x-message-ttl": 5})
        assert declared_queue_type(conn) is None
        assert list_queues(other)[rung_name(3600)]["arguments"].get("x-message-ttl") == 5


def test_check_declare_and_replay_work_on_the_quorum_profile_without_being_told(
        fresh_vhost: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn, queue_type="quorum")
    code, out, err = operate(capsys, url, "check", "--min-relays", "0")
    assert (code, err) == (0, ""), err
    assert out.startswith("ok: topology as the quorum profile says;"), out
    code, out, err = operate(capsys, url, "declare")
    assert (code, err) == (0, "")
    assert out.split() == [*rung_names(), CONTROL]
    code, out, err = operate(capsys, url, "replay")
    assert (code, err) == (0, "") and "replayed 0 parked message(s)" in out
    assert profiles(fresh_vhost) == QUORUM


def test_queue_type_is_an_option_of_every_command_that_declares_or_checks(
        fresh_vhost: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = vhost_url(fresh_vhost)
    assert operate(capsys, url, "declare", "--queue-type", "quorum")[0] == 0
    assert profiles(fresh_vhost) == QUORUM
    assert operate(capsys, url, "check", "--queue-type", "quorum", "--min-relays", "0")[0] == 0
    assert operate(capsys, url, "replay", "--queue-type", "quorum")[0] == 0
    code, out, err = operate(capsys, url, "check", "--queue-type", "classic", "--min-relays", "0")
    assert code == 1 and "exists with settings other than the contract's" in err, err
    code, out, err = operate(capsys, url, "declare", "--queue-type", "classic")
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("Error: ") and \
        "declared by the quorum profile" in err, err
    code, out, err = operate(capsys, url, "replay", "--queue-type", "classic")
    assert code == 1 and "declared by the quorum profile" in err
    code, out, err = operate(capsys, url, "declare", "--queue-type", "stream")
    assert code == 2 and "'stream' is not one of 'classic', 'quorum'" in err
    assert profiles(fresh_vhost) == QUORUM
    for command in ("declare", "check", "replay", "move", "relay"):
        code, out, _ = operate(capsys, url, command, "--help")
        assert code == 0 and "--queue-type" in out, command


def test_celery_ladder_check_and_declare_take_queue_type(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    declared = celery_ladder_cli(url, "declare", "--queue-type", "quorum")
    assert declared.returncode == 0, declared.stderr
    assert profiles(fresh_vhost) == QUORUM
    checked = celery_ladder_cli(url, "check", "--queue-type", "quorum", "--min-relays", "0")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("ok: topology as the quorum profile says;")
    # Without the option: the app's ladder_queue_type (classic here), which its producers would declare.
    classic = celery_ladder_cli(url, "check", "--min-relays", "0")
    assert classic.returncode == 1 and "other than the contract's" in classic.stderr


def test_a_relay_runs_on_the_quorum_profile_without_being_told(fresh_vhost: str, tmp_path: Path) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn, queue_type="quorum")
        conn.default_channel.queue_declare("t.quorum", durable=True, auto_delete=False)
        LadderProducer(conn.default_channel, queue_type="quorum").publish(b"x", routing_key="t.quorum", countdown=1.2)
    log = tmp_path / "relay.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "kombu_ladder", "relay", "--broker", url],
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        with Connection(url) as conn:
            def delivered() -> bool:
                assert proc.poll() is None, log.read_text()
                return conn.default_channel.queue_declare("t.quorum", passive=True)[1] == 1

            wait_for(delivered, 30, message="the message delivered by a relay on the quorum profile")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "conflicts" not in log.read_text() and "Traceback" not in log.read_text()


def test_move_declares_the_sources_profile_on_an_empty_target(fresh_vhost: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    source = vhost_url(fresh_vhost)
    with Connection(source) as conn:
        declare(conn, queue_type="quorum")
        LadderProducer(conn.default_channel, queue_type="quorum").publish(b"x", routing_key="t.move", countdown=600)
    with temporary_vhost(f"{fresh_vhost}-to") as target:
        code, out, err = operate(capsys, source, "move", "--to", vhost_url(target))
        assert (code, err) == (0, ""), err
        assert "moved 1 message(s)" in out
        assert profiles(target) == QUORUM
        assert PARKING in list_queues(target)
    with temporary_vhost(f"{fresh_vhost}-to2") as target:  # told otherwise: moving between profiles is allowed
        with Connection(source) as conn:
            LadderProducer(conn.default_channel, queue_type="quorum").publish(b"y", routing_key="t.move",
                                                                              countdown=600)
        code, out, err = operate(capsys, source, "move", "--to", vhost_url(target), "--queue-type", "classic")
        assert (code, err) == (0, ""), err
        assert profiles(target) == CLASSIC
