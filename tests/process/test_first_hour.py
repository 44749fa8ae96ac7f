"""The first hour (issue 40): the README's commands, then the quickstarts, in order, on one fresh vhost, as a new
user runs them; every line any of them prints (the workers' logs included) is read, and a warning or an error a
new user would see fails the run. Then ``kombu-ladder status`` and ``check`` on the setup that flow made.

``make first-hour`` runs this file alone; ``make test`` runs it too. The broker is named the way a Celery project
names it, ``CELERY_BROKER_URL`` (the README's ``proj.py`` and the examples' ``BROKER_URL`` point at the same
vhost), and neither ``KOMBU_LADDER_BROKER`` nor ``--broker`` is given: the commands must find it themselves.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from docs_blocks import Block, Command, blocks, commands_of
from helpers import vhost_url
from test_docs import CHECKS, LOCAL_BROKER, NOT_RUN, PROJECT_SNIPPET, Shell, assert_output_matches

#: The pages a new user follows, in the order they follow them.
PAGES = ("README.md", "quickstart.rst")

#: What a new user reads as a warning or an error, in any output line.
ALARMING = re.compile(r"\b(?:WARNING|ERROR|CRITICAL)\b|Traceback|^Error:|\w+Warning\b|\bwarn(?:ing)?:", re.I | re.M)


#: Lines this machine prints that a user's does not, and why: matched only where the condition holds.
NOT_THE_USERS = (
    # The test machine runs everything as root; Celery warns of it, and a user's shell is not root.
    (os.geteuid() == 0, "SecurityWarning: You're running the worker with superuser privileges"),
    # ... and where Python prints the warning's source line under it (3.12 does), that line too.
    (os.geteuid() == 0, "warnings.warn(SecurityWarning(ROOT_DISCOURAGED.format("),
)


def first_hour_blocks() -> list[Block]:
    """The console blocks of :data:`PAGES`, page after page, in page order, but the install lines (make installs
    the clone into .venv, where this runs)."""
    return [b for page in PAGES for b in blocks("console") if b.page == page
            and not any(c.line.startswith("pip install") for c in commands_of(b))]


class FirstHourShell(Shell):
    """A :class:`~test_docs.Shell` whose environment is a Celery project's, and that keeps everything printed."""

    def __init__(self, block: Block, workdir: Path, url: str, printed: list[tuple[str, str]]) -> None:
        super().__init__(block, workdir, [url])
        self.env.pop("KOMBU_LADDER_BROKER", None)
        self.env["CELERY_BROKER_URL"] = url
        self.printed = printed

    def run(self, command: Command) -> str:
        argv = self.argv(command)
        if argv[0] == "cd" or "worker" in argv or argv[:2] == ["kombu-ladder", "relay"]:
            return super().run(command)
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=180)
        self.printed.append((command.line, done.stdout + done.stderr))
        assert done.returncode == 0, f"$ {command.line}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.printed += [(line, log.read_text()) for line, _, log in self.background]


def alarms(printed: list[tuple[str, str]]) -> list[str]:
    """Every printed line a new user would read as a warning or an error, with the command that printed it."""
    return [f"$ {command}\n    {line}" for command, text in printed for line in text.splitlines()
            if ALARMING.search(line) and not any(holds and known in line for holds, known in NOT_THE_USERS)]


@pytest.fixture
def flow(fresh_vhost: str, tmp_path: Path) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    url = vhost_url(fresh_vhost)
    (tmp_path / "proj.py").write_text(PROJECT_SNIPPET.replace(LOCAL_BROKER, url))  # "Save it as proj.py"
    yield url, []


@pytest.mark.broker
@pytest.mark.celery
@pytest.mark.timeout(1200)
def test_the_first_hour_runs_without_a_warning_or_an_error(flow: tuple[str, list[tuple[str, str]]],
                                                           tmp_path: Path) -> None:
    url, printed = flow
    ran = []
    for block in first_hour_blocks():
        shell = FirstHourShell(block, tmp_path, url, printed)
        try:
            for command in commands_of(block):
                if " ".join(command.argv) in NOT_RUN:
                    continue
                out = shell.run(command)
                ran.append(command.line)
                if command.output:
                    assert_output_matches(command.output, out, command.line)
                if command.line in CHECKS:
                    CHECKS[command.line](out, shell)
        finally:
            shell.stop()
    assert any(line.startswith("make demo") for line in ran) and any("celery_app.py" in line for line in ran), ran
    # The setup the README calls complete reports healthy (no relay is running any more: --min-relays 0).
    after = FirstHourShell(Block("first hour", 0, "console", ""), tmp_path, url, printed)
    failed = []
    for line in ("kombu-ladder status", "kombu-ladder check --min-relays 0"):
        try:
            after.run(Command(line))
        except AssertionError as exc:  # said with the warnings below, all at once
            failed.append(str(exc))
    found = alarms(printed)
    assert not failed and not found, "\n".join(["a new user sees these warnings or errors:", *found, *failed])
