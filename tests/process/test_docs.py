"""The docs say what the code does: snippets and command lines run, every contract value and setting is there."""

from __future__ import annotations

import ast
import doctest
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import unquote

import click
import pytest
from celery import Celery, concurrency
from docs_blocks import Block, Command, blocks, commands_of, inline_commands, is_excerpt
from figures import differences
from helpers import ladder_counters, list_queues, queue_depth, temporary_vhost, vhost_url, wait_for
from kombu import Connection

from celery_ladder import cli as celery_ladder_cli
from celery_ladder.settings import SETTINGS, Setting
from kombu_ladder import LadderProducer, __version__, contract, declare
from kombu_ladder.cancellation.stream import declare_cancellations
from kombu_ladder.cli import cli
from kombu_ladder.contract import CONTROL
from kombu_ladder.depths import queue_depths
from kombu_ladder.plan import MAX_DELAY

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(p.name for p in DOCS.glob("*.rst") if ">>>" in p.read_text()))
def test_doctests_in_the_pages_pass(name: str) -> None:
    result = doctest.testfile(str(DOCS / name), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} doctest(s) failed in docs/{name}"


def test_how_it_works_has_the_contracts_worked_examples() -> None:
    text = page("how.rst")
    # The 4 h and 90 s examples are checked by the doctests; the tables must agree with them.
    assert text.count("``acemq.schedule.1h``") >= 4
    assert text.count("``acemq.schedule.10s``") >= 3


def _string_constants() -> dict[str, str]:
    return {name: getattr(contract, name) for name in contract.__all__
            if isinstance(getattr(contract, name), str)}


@pytest.mark.parametrize("name", sorted(_string_constants()))
def test_contract_page_names_every_contract_value(name: str) -> None:
    assert f"``{_string_constants()[name]}``" in page("contract.rst") or \
        f"``{_string_constants()[name]}" in page("contract.rst"), f"contract.{name} is not on the contract page"


@pytest.mark.parametrize("seconds", contract.RUNGS)
def test_contract_page_lists_every_rung_with_its_ttl(seconds: int) -> None:
    text = page("contract.rst")
    row = re.search(rf"``{re.escape(contract.rung_name(seconds))}``\n\s+- .*``x-message-ttl`` = ``(\d+)``", text)
    assert row is not None, f"no row for {contract.rung_name(seconds)}"
    assert int(row.group(1)) == contract.arguments_for(seconds)["x-message-ttl"]


def test_contract_page_lists_the_prefetch_and_the_maximum_delay() -> None:
    text = page("contract.rst")
    assert f"prefetch of {contract.PREFETCH}" in text
    assert MAX_DELAY == 3653 * 24 * 3600 and "ten years by default" in text


def _shown(default: Any) -> str:
    """A default as the reference shows it: strings in double quotes, whole seconds as integers."""
    if isinstance(default, str):
        return f'"{default}"'
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return repr(default)


def _generated_settings() -> str:
    """The relay options' reference as the ``ladder-settings`` directive writes it (docs/_ext)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import ladder_figures
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return "\n".join(ladder_figures.settings_rst())


def test_the_relay_options_reference_is_generated_from_the_one_table() -> None:
    """Every relay option's default and bounds come from kombu_ladder.tuning; none is written in the page."""
    from kombu_ladder.tuning import PRECEDENCE, TUNABLES

    text, generated = page("configuration.rst"), _generated_settings()
    assert ".. ladder-settings::" in text
    for tunable in TUNABLES.values():
        assert not re.search(rf"^``{tunable.setting}``\n\s+:", text, re.M), f"{tunable.setting} is written by hand"
        assert f"``{tunable.setting}``\n    :Django name: ``CELERY_{tunable.setting.upper()}``\n    :Default: " \
               f"``{_shown(tunable.default)}``\n    :Accepted: " in generated, tunable.name
        assert tunable.bounds() in generated and f"relay {tunable.option}``" in generated
    assert "first of these\nwins: the command-line option, the environment variable" in text
    assert PRECEDENCE == ("command-line option", "environment variable", "Celery/Django setting", "default")


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_configuration_reference_names_every_setting_default_and_django_name(setting: Setting) -> None:
    text = page("configuration.rst") + "\n" + _generated_settings()
    row = re.search(rf"^``{setting.name}``\n\s+:Django name: ``{setting.django}``\n\s+:Default: ``([^`]+)``",
                    text, re.M)
    assert row is not None, f"{setting.name} / {setting.django} is missing from the configuration reference"
    assert row.group(1) == _shown(setting.default)


def test_configuration_reference_names_every_kombu_ladder_command_and_option() -> None:
    text = page("configuration.rst")
    options = [opt for param in cli.params for opt in param.opts if opt.startswith("--")]
    for name, command in cli.commands.items():
        assert f"``{name}" in text, f"kombu-ladder {name} is not documented"
        options += [opt for param in command.params for opt in param.opts if opt.startswith("--")]
    missing = sorted({opt for opt in options if opt != "--help" and opt not in text})
    assert not missing, f"undocumented kombu-ladder options: {missing}"


def test_the_diagram_svg_is_made_from_its_source_and_shows_every_queue() -> None:
    source = (DOCS / "diagrams" / "ladder.dot").read_text()
    svg = (DOCS / "_static" / "ladder.svg").read_text().replace("&#45;", "-")
    for name in [*contract.rung_names(), contract.CONTROL, contract.PARKING, contract.EXCHANGE]:
        assert name in source and name in svg, name
    # Every label in the source is in the committed SVG: it was regenerated after the last edit.
    labels = {part for label in re.findall(r'label="([^"]*)"', source) for part in label.split("\\n") if part}
    missing = sorted(label for label in labels if label.replace("&", "&amp;").replace("<", "&lt;") not in svg)
    assert not missing, f"docs/_static/ladder.svg is stale, run 'make diagrams': {missing}"


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_make_diagrams_reproduces_the_committed_svg(tmp_path: Path) -> None:
    out = tmp_path / "ladder.svg"
    subprocess.run(["dot", "-Tsvg", str(DOCS / "diagrams" / "ladder.dot"), "-o", str(out)], check=True, timeout=60)

    def shapes(svg: str) -> list[str]:
        return re.findall(r"<text[^>]*>([^<]*)</text>", svg)

    assert shapes(out.read_text()) == shapes((DOCS / "_static" / "ladder.svg").read_text())


def test_the_version_lives_in_one_place_and_the_changelog_has_it() -> None:
    from kombu_ladder import __version__

    assert "version = attr: kombu_ladder.__version__" in (ROOT / "setup.cfg").read_text()
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text()


@pytest.mark.parametrize("package", ["kombu_ladder", "celery_ladder"])
def test_both_packages_ship_py_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
    assert re.search(rf"^\s*{package} = py\.typed$", (ROOT / "setup.cfg").read_text(), re.M)


# -- the pages' snippets and command lines run as shown -----------------------------------------------
#
# Console blocks run command by command: from the repository root when they use examples/ or make,
# else from a directory holding proj.py (the README's Celery snippet, as the README says to save it).
# The venv's bin/ leads PATH, as if activated. The pages' broker URLs stand for a real deployment:
# each becomes a fresh vhost of the test broker, and BROKER_URL and KOMBU_LADDER_BROKER name it.

#: Documented command lines the suite does not run, and why.
NOT_RUN = {"make test": "it is the test suite itself; .ci/run runs it"}

#: Seconds a documented command may take.
COMMAND_TIMEOUT = 180

#: A URL where no broker answers (for the inline commands' placeholders).
NO_BROKER = "amqp://guest:guest@127.0.0.1:1//"

PROJECT_SNIPPET = next(b for b in blocks("python") if b.page == "README.md").text
LOCAL_BROKER = "amqp://guest:guest@localhost//"


def assert_output_matches(shown: Sequence[str], printed: str, command: str) -> None:
    """Each line the page shows under a command is printed, token by token: every figure equal, or within the
    tolerance ``figures.VARYING`` states for it; clock times, ids and node names may differ."""
    problems = differences(command, shown, printed)
    assert not problems, (f"$ {command}\n" + "\n".join(problems) + "\nthe page shows:\n" + "\n".join(shown)
                          + "\nit printed:\n" + printed)


def _vhost_of(url: str) -> str:
    return unquote(url.rsplit("/", 1)[1])


class Shell:
    """Runs one console block's commands in order, as a reader would in an activated venv."""

    def __init__(self, block: Block, workdir: Path, urls: list[str]) -> None:
        lines = [c.line for c in commands_of(block)]
        self.cwd = ROOT if any("examples" in line or line.startswith("make ") for line in lines) else workdir
        self.urls = urls
        self.url_map: dict[str, str] = {}
        self.env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
                        BROKER_URL=urls[0], KOMBU_LADDER_BROKER=urls[0], LADDER_DEMO_BROKER=urls[0])
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.background: list[tuple[str, subprocess.Popen[str], Path]] = []
        self.logs = workdir

    def argv(self, command: Command) -> list[str]:
        argv = command.argv
        for i, arg in enumerate(argv):
            if re.match(r"^amqps?://", arg):
                if arg not in self.url_map:
                    self.url_map[arg] = self.urls[len(self.url_map)]
                argv[i] = self.url_map[arg]
            elif argv[0] == "rabbitmqctl" and i and argv[i - 1] == "-p":
                argv[i] = _vhost_of(self.urls[0])
        return argv

    def run(self, command: Command) -> str:
        argv = self.argv(command)
        if argv[0] == "cd":
            self.cwd = (self.cwd / argv[1]).resolve()
            return ""
        if "worker" in argv or argv[:2] == ["kombu-ladder", "relay"]:
            self.start(command.line, argv)
            return ""
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT)
        assert done.returncode == 0, f"$ {command.line}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    def start(self, line: str, argv: list[str]) -> None:
        log = self.logs / f"background-{len(self.background)}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        self.background.append((line, proc, log))
        app = Celery(broker=self.urls[0], set_as_current=False)
        try:
            def up() -> bool:
                assert proc.poll() is None, f"$ {line} exited:\n{log.read_text()[-3000:]}"
                with Connection(self.urls[0]) as conn:
                    relaying = any(row.queue == CONTROL and row.consumers for row in queue_depths(conn))
                return relaying and (argv[0] != "celery" or bool(app.control.ping(timeout=0.5)))

            wait_for(up, timeout=90, interval=0.5, message=f"'{line}' to start and relay")
        finally:
            app.close()

    def stop(self) -> None:
        for line, proc, log in reversed(self.background):
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(f"'{line}' did not stop on SIGTERM:\n{log.read_text()[-3000:]}")
            assert code == 0, f"'{line}' exited with {code}:\n{log.read_text()[-3000:]}"
            assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


#: Checks beyond the output a page shows, for commands whose page says what they do in words.
def _check_status_shows_the_task_in_the_1h_rung(printed: str, shell: Shell) -> None:
    assert re.search(r"^acemq\.schedule\.1h\s+1\s+0$", printed, re.M), printed


def _check_the_policy_applies_to_the_rungs(printed: str, shell: Shell) -> None:
    vhost = _vhost_of(shell.urls[0])
    with Connection(shell.urls[0]) as conn:
        declare(conn)
    wait_for(lambda: all(q.get("policy") == "ladder-lazy" for name, q in _policies(vhost).items()
                         if name.startswith("acemq.schedule.")), 30, message="the policy on the ladder's queues")


def _policies(vhost: str) -> dict[str, dict[str, Any]]:
    return list_queues(vhost, "policy")


def _check_inspect_scheduled_is_0(printed: str, shell: Shell) -> None:
    assert '"scheduled": 0' in printed and '"delivered": 1' in printed, printed


def _check_check_prints_the_line_the_page_quotes(printed: str, shell: Shell) -> None:
    assert printed == ("ok: topology as the contract says; 0 relay(s) consuming; backlog 0 (under 1000); "
                       "the control plane is declared, ladder.cancellations included\n"), printed


def _check_demo_prints_the_readme_table(printed: str, shell: Shell) -> None:
    """The README's table is what ``make demo`` prints on RabbitMQ (LADDER_DEMO_BROKER: the test's vhost)."""
    (table,) = [b for b in blocks("text") if b.page == "README.md" and "arrival order" in b.text]
    shown = table.text.splitlines()
    header = next(line for line in shown if line.strip())
    lines = printed.splitlines()
    assert header in lines, printed
    start = lines.index(header)
    ran = "\n".join(lines[start:start + len(shown)])
    problems = differences("make demo", shown, ran)
    assert not problems, "\n".join(problems) + "\nthe README shows:\n" + table.text + "\nmake demo printed:\n" + printed


def _check_adopt_moved_the_two_eta_tasks(printed: str, shell: Shell) -> None:
    assert printed.splitlines()[1:3] == [
        "  adopted 2 ETA task(s) into the ladder",
        "  left 1 in place: 1 without an ETA, 0 due within 10 s, 0 ladder copies"], printed
    with Connection(shell.urls[0]) as conn:
        assert sum(queue_depth(conn, rung, if_missing=0) for rung in contract.rung_names()) == 2
        assert queue_depth(conn, "celery") == 1


#: The Celery task id docs/waiting.rst finds and cancels.
WAITING_TASK_ID = "6f1c1b2e-0d4e-4c8e-9a51-1f0f3c2b7a10"


def _publish_indexed(url: str) -> None:
    """What docs/waiting.rst assumes: Celery-shaped invoice tasks scheduled with the index on."""
    with Connection(url) as conn:
        producer = LadderProducer(conn.default_channel, index=True)
        for n, task_id in enumerate([WAITING_TASK_ID, *(f"invoice-{i}" for i in range(4))]):
            producer.publish(b"[[], {}, {}]", exchange="", routing_key="invoices", countdown=1800 + 3600 * n,
                             correlation_id=task_id, content_type="application/json",
                             headers={"task": "billing.send_invoice", "id": task_id})


def _check_find_shows_the_task_waiting(printed: str, shell: Shell) -> None:
    assert printed.startswith(f"{WAITING_TASK_ID}: waiting\n") and "billing.send_invoice" in printed, printed


def _check_the_dry_run_lists_every_invoice_and_records_nothing(printed: str, shell: Shell) -> None:
    lines = printed.strip().splitlines()
    assert len(lines) == 6 and lines[0].startswith(WAITING_TASK_ID + "\t"), printed
    assert lines[-1].startswith("dry run: would cancel 5 waiting message(s)"), printed


CHECKS: dict[str, Callable[[str, Shell], None]] = {
    "make demo     # schedule 65 s, 12 s, 5 s and 2 s messages, longest first, and watch them arrive":
        _check_demo_prints_the_readme_table,
    "kombu-ladder status                    # it waits in acemq.schedule.1h":
        _check_status_shows_the_task_in_the_1h_rung,
    "rabbitmqctl set_policy -p prod --apply-to queues --priority 10 ladder-lazy '^acemq\\.schedule\\.' "
    "'{\"queue-mode\":\"lazy\"}'": _check_the_policy_applies_to_the_rungs,
    "celery -A celery_app inspect ladder": _check_inspect_scheduled_is_0,
    "celery -A proj ladder adopt --queue celery": _check_adopt_moved_the_two_eta_tasks,
    "kombu-ladder check --min-relays 0      # exit status 0, and one line":
        _check_check_prints_the_line_the_page_quotes,
    f"kombu-ladder waiting find {WAITING_TASK_ID}": _check_find_shows_the_task_waiting,
    "kombu-ladder cancel --task billing.send_invoice --dry-run":
        _check_the_dry_run_lists_every_invoice_and_records_nothing,
}


#: What the operations page's ``status`` and ``move`` examples find waiting: (countdown in seconds, how many).
#: Each countdown's first rung is one the test outlives (1h, 10m, 1m), so the counts hold while it runs.
WAITING = ((7200, 3), (1500, 2), (300, 1))

#: The tasks the pages' ``inspect ladder`` examples were sent, by countdown: 3 s waits in the 1 s rung and is
#: held; 25 s takes the 10 s rung twice (one hop) and is held for the rest (kombu_ladder.plan.forecast).
TASK_COUNTDOWNS = (3, 25)


def _publish_waiting(url: str, waiting: Sequence[tuple[int, int]]) -> None:
    with Connection(url) as conn:
        producer = LadderProducer(conn.default_channel)
        for countdown, count in waiting:
            for _ in range(count):
                producer.publish(b"waiting", exchange="", routing_key="docs.q", countdown=countdown)


def _start_relays(shell: Shell, count: int) -> None:
    for _ in range(count):
        shell.start("kombu-ladder relay", ["kombu-ladder", "relay", "--broker", shell.urls[0]])

    def consumers() -> int:
        with Connection(shell.urls[0]) as conn:
            return next((row.consumers or 0 for row in queue_depths(conn) if row.queue == CONTROL), 0)

    wait_for(lambda: consumers() == count, 60, interval=0.2, message=f"{count} relays consuming {CONTROL}")


def _send_tasks_and_wait(shell: Shell) -> None:
    """Send the README project's task with :data:`TASK_COUNTDOWNS` and wait until the worker delivered them."""
    code = "import proj\n" + "".join(f"proj.send_invoice.apply_async(({n},), countdown={n})\n"
                                      for n in TASK_COUNTDOWNS)
    done = subprocess.run([sys.executable, "-c", code], cwd=shell.cwd, env=shell.env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    app = Celery(broker=shell.urls[0], set_as_current=False)
    try:
        wait_for(lambda: any(c.get("delivered") == len(TASK_COUNTDOWNS) for c in ladder_counters(app).values()),
                 max(TASK_COUNTDOWNS) + 60, interval=0.5, message="the worker to deliver the pages' tasks")
    finally:
        app.close()


def _prepare(block: Block, shell: Shell) -> None:
    """What a page assumes already happened: something waiting in the ladder, relays or a worker running."""
    lines = [c.line for c in commands_of(block)]
    url = shell.urls[0]
    if any(re.match(r"kombu-ladder status --broker \S+$", line) for line in lines):
        _publish_waiting(url, WAITING)
        with Connection(url) as conn:
            declare_cancellations(conn)  # as 'kombu-ladder declare' left it on a deployed ladder
        _start_relays(shell, 2)
    if any(re.match(r"kombu-ladder --broker \S+ move", line) for line in lines):
        _publish_waiting(url, WAITING)
    if any(re.match(r"kombu-ladder status --broker \S+ --due", line) for line in lines):
        _publish_waiting(url, [(7200, 1)])
        with Connection(url) as conn:
            declare_cancellations(conn)  # as the relays of a running ladder have (status reports it)
    if any(line.startswith("kombu-ladder find invoice-42") for line in lines):
        with Connection(url) as conn:
            LadderProducer(conn.default_channel).publish(b"invoice", exchange="billing", routing_key="invoice.due",
                                                         countdown=7200, message_id="invoice-42")
    if any(line.startswith(("kombu-ladder waiting", "kombu-ladder cancel --")) for line in lines):
        _publish_indexed(url)
    if any(line.startswith("celery -A proj ladder adopt") for line in lines):  # an old producer's tasks wait
        old = Celery("old", broker=shell.urls[0], set_as_current=False)
        try:
            with old.connection_for_write() as conn:
                conn.default_channel.queue_declare("celery", durable=True, auto_delete=False)
            for countdown in (3600, None, 7200):
                old.send_task("proj.remind", countdown=countdown)
        finally:
            old.close()
    if any(" inspect ladder" in line for line in lines) and not any(" worker" in line for line in lines):
        shell.start("celery -A proj worker -P ladder", ["celery", "-A", "proj", "worker", "-P", "ladder"])
        _send_tasks_and_wait(shell)


@pytest.fixture
def two_vhosts(fresh_vhost: str) -> Iterator[list[str]]:
    with temporary_vhost(f"{fresh_vhost}-green") as green:
        yield [vhost_url(fresh_vhost), vhost_url(green)]


def _install_blocks() -> list[Block]:
    return [b for b in blocks("console") if any(c.line.startswith("pip install") for c in commands_of(b))]


@pytest.mark.broker
@pytest.mark.celery
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", [b for b in blocks("console") if b not in _install_blocks()], ids=lambda b: b.id)
def test_every_console_block_runs_as_shown(block: Block, two_vhosts: list[str], tmp_path: Path) -> None:
    (tmp_path / "proj.py").write_text(PROJECT_SNIPPET.replace(LOCAL_BROKER, two_vhosts[0]))
    shell = Shell(block, tmp_path, two_vhosts)
    _prepare(block, shell)
    try:
        for command in commands_of(block):
            if shlex.split(command.line, comments=True) and " ".join(command.argv) in NOT_RUN:
                continue
            printed = shell.run(command)
            if command.output:
                assert_output_matches(command.output, printed, command.line)
            if command.line in CHECKS:
                CHECKS[command.line](printed, shell)
    finally:
        shell.stop()


def test_the_commands_not_run_are_documented_ones() -> None:
    documented = {" ".join(c.argv) for b in blocks("console") for c in commands_of(b)}
    assert set(NOT_RUN) <= documented
    assert set(CHECKS) <= {c.line for b in blocks("console") for c in commands_of(b)}


INSTALL_LINES = sorted({c.line for b in _install_blocks() for c in commands_of(b)
                        if c.line.startswith("pip install")}
                       | {c for _, c in inline_commands() if c.startswith("pip install")})


@pytest.mark.process
@pytest.mark.timeout(600)
@pytest.mark.parametrize("line", INSTALL_LINES)
def test_the_install_lines_install_this_clone(line: str, tmp_path: Path) -> None:
    """Every ``pip install`` a page shows, run where the pages say (the clone's root), resolves to this
    checkout with the extras it names (a dry run: tests/process/test_packaging.py installs for real)."""
    report = tmp_path / "report.json"
    argv = shlex.split(line)
    assert argv[:2] == ["pip", "install"] and re.fullmatch(r"\.(\[[\w,]+\])?", argv[2]), f"{line}: from the clone"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                           "--report", str(report), *argv[2:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    installs = {item["metadata"]["name"].lower().replace("_", "-"): item
                for item in json.loads(report.read_text())["install"]}
    assert installs["kombu-ladder"]["metadata"]["version"] == __version__
    assert installs["kombu-ladder"]["download_info"]["url"].rstrip("/") == ROOT.as_uri()
    extras = set(re.findall(r"\[(.*)\]", line)[0].split(",")) if "[" in line else set()
    assert sorted(installs["kombu-ladder"].get("requested_extras", [])) == sorted(extras)
    assert ("celery" in installs) == bool(extras & {"celery", "django"})
    assert ("django" in installs) == ("django" in extras)
    assert ("prometheus-client" in installs) == ("prometheus" in extras)


# -- Python snippets -----------------------------------------------------------------------------------

PYTHON = [b for b in blocks("python") if ">>>" not in b.text]


@pytest.mark.parametrize("block", [b for b in PYTHON if is_excerpt(b)], ids=lambda b: b.id)
def test_excerpts_are_marked_and_still_parse(block: Block) -> None:
    ast.parse(block.text)


def test_the_index_and_readme_celery_snippets_are_the_same_program() -> None:
    index = next(b for b in PYTHON if b.page == "index.rst")
    assert index.text == PROJECT_SNIPPET


@pytest.mark.broker
@pytest.mark.parametrize("block", [b for b in PYTHON if not is_excerpt(b)], ids=lambda b: b.id)
def test_every_python_snippet_runs(block: Block, fresh_vhost: str, tmp_path: Path) -> None:
    url = vhost_url(fresh_vhost)
    source = block.text.replace(LOCAL_BROKER, url)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if "def test_" in source:  # a test a reader would put in their suite: run it with the package's fixtures
        (tmp_path / "test_snippet.py").write_text(source)
        # With pytest-celery's plugin, and without it (a suite that has only Celery and the ladder).
        for plugins in ([], ["-p", "no:celery"]):
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins,
                                   "test_snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, (plugins, done.stdout[-3000:] + done.stderr[-3000:])
            assert re.search(r"\b1 passed\b", done.stdout), done.stdout
        return
    (tmp_path / "snippet.py").write_text(source)
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if "apply_async" in source:  # the README's and index's promise: the task waits in a rung, not a worker
        with Connection(url) as conn:
            assert queue_depth(conn, "acemq.schedule.1h") == 1


@pytest.mark.parametrize("block", [*blocks("python"), *blocks("console")], ids=lambda b: b.id)
def test_code_lines_fit_the_code_box(block: Block) -> None:
    """At 1280 px the docs' code box shows about 88 characters; wider lines hide behind a scrollbar."""
    if block.page.endswith(".md") and block.page != "benchmarks.md":
        return  # the README renders on the code host, which scrolls as it likes
    long = [line for line in block.text.splitlines() if len(line) > 88]
    assert not long, f"{block.id}: {long}"


# -- inline command literals parse ------------------------------------------------------------------

PLACEHOLDERS = {"URL": NO_BROKER, "BLUE": NO_BROKER, "N": "5", "BYTES": "1048576", "SECONDS": "1.5", "TEXT": "x",
                "NAME": "x", "PORT": "9808", "classic|quorum": "quorum", "WHEN": "90"}


def _concrete(command: str) -> list[str]:
    command = command.split(" | ")[0].replace("[", " ").replace("]", " ").replace("...", " ")
    return [PLACEHOLDERS.get(token, token) for token in shlex.split(command)]


def _parses(group: click.Group, args: list[str]) -> None:
    if "COMMAND" in args or not args:
        return
    ctx = group.make_context(group.name or "cli", [*args], resilient_parsing=False)
    with warnings.catch_warnings():  # click 8.2 deprecates protected_args; 8.1 keeps the command name there
        warnings.simplefilter("ignore", DeprecationWarning)
        remaining = [*ctx.protected_args, *ctx.args]
    name, command, rest = group.resolve_command(ctx, remaining)
    assert command is not None
    command.make_context(name or "", rest, parent=ctx)


@pytest.mark.parametrize("page,command", sorted(set(inline_commands())))
def test_inline_command_literals_parse(page: str, command: str) -> None:
    args = _concrete(command)
    if args[:2] == ["pip", "install"]:
        assert command in INSTALL_LINES
    elif args[0] == "kombu-ladder" or args[:3] == ["python", "-m", "kombu_ladder"]:
        _parses(cli, args[1 if args[0] == "kombu-ladder" else 3:])
    elif args[3:4] == ["ladder"]:
        _parses(celery_ladder_cli.ladder, args[4:])
    elif args[3:4] == ["worker"]:
        pool = args[args.index("-P") + 1]
        assert pool == "ladder" or pool in concurrency.ALIASES, command
    else:
        assert args[3:5] == ["inspect", "ladder"], command


@pytest.mark.parametrize("path", sorted({m for p in DOCS.glob("*.rst")
                                          for m in re.findall(r"\.\. literalinclude:: (\S+)", p.read_text())}))
def test_included_example_lines_fit_the_code_box(path: str) -> None:
    long = [n for n, line in enumerate((DOCS / path).read_text().splitlines(), 1) if len(line) > 88]
    assert not long, f"{path}: lines {long} are wider than the docs' code box"
