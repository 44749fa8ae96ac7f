"""Issue 40: the troubleshooting page quotes each first-hour message as the code prints it, with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kombu_ladder.brokers import BROKER_ENVS
from kombu_ladder.cli.commands import E_CONNECT
from kombu_ladder.cli.console import E_EXTRA
from kombu_ladder.cli.waiting import I_UNINDEXED

# The page quotes the console's first line, which needs the [web] extra (make test installs it; a matrix
# stack installs [celery,test,django] only, and collects every file to find the celery-marked ones).
pytest.importorskip("jinja2", reason="the [web] extra is not installed")
from kombu_ladder.web.serve import serving_line  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "docs" / "faq.rst"


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("What a new user meets in the first hour")
    return " ".join(text[start:text.index("Can I cancel a scheduled message?")].split())


@pytest.mark.parametrize("quoted", [
    I_UNINDEXED.split(":")[0].replace("{n}", "N"),
    E_CONNECT.split(".")[0].replace("{url}", "amqp://guest:**@127.0.0.1:5672//"),
    E_EXTRA.split(":")[0].replace("{missing}", "uvicorn"),
    serving_line(("127.0.0.1", 8642), read_only=False),
    "publish() got an unexpected keyword argument 'contdown'",
    "countdown=...s is longer than the maximum delay of ...",
    "is not declared ... run 'kombu-ladder declare'",
])
def test_the_page_quotes_the_message_as_printed(quoted: str) -> None:
    assert f"``{quoted}" in _section() or quoted in _section(), quoted


def test_the_page_names_every_variable_the_cli_reads_the_broker_from_in_order() -> None:
    section = _section()
    positions = [section.index(f"``${name}``") for name in BROKER_ENVS]
    assert positions == sorted(positions) and section.index("``--broker``") < positions[0]


def test_the_unindexed_fix_names_each_way_to_turn_the_index_on() -> None:
    section = _section()
    for way in ("ladder_index = True", "CELERY_LADDER_INDEX", "Scheduler.on(connection, index=True)",
                "LadderProducer(channel, index=True)"):
        assert way in section, way
        assert way in " ".join(I_UNINDEXED.split()) or way == "CELERY_LADDER_INDEX", way  # Django's name: the page
