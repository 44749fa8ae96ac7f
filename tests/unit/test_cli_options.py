"""Every numeric option of both command lines refuses nan, inf, negatives, meaningless zeros and absurd values.

The table is not written by hand: it is read from the click command trees of
``kombu-ladder`` and ``celery ladder``, so an option added later is checked too.
Each bad value must give exactly one ``Error: ...`` line naming the option, exit
status 2, nothing on stdout: never a traceback, never a value quietly accepted.
"""

from __future__ import annotations

import os
import re
from typing import Iterator, NamedTuple
from unittest import mock

import click
import pytest
from click.testing import CliRunner

from celery_ladder.cli import ladder
from kombu_ladder.cli import cli, main
from kombu_ladder.cli.options import MessageId, Number

#: Where no broker answers: every value here must be refused before a connection is tried.
UNREACHABLE = "amqp://guest:guest@127.0.0.1:1//"

#: Values no numeric option may take: not numbers, not finite, negative, or absurd (a timeout of 1e12 s,
#: a billion-plus messages).
ALWAYS_BAD = ("nan", "NaN", "inf", "-inf", "1e400", "-1", "-0.5", "1000000000000", "1e12")


class NumericOption(NamedTuple):
    cli: str  # "kombu-ladder" or "celery ladder"
    path: tuple[str, ...]  # the subcommands leading to the command that has the option
    command: click.Command
    param: click.Parameter

    @property
    def id(self) -> str:
        return " ".join([self.cli, *self.path, self.param.opts[0]])


def _commands(group: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        for name, command in sorted(group.commands.items()):
            yield from _commands(command, (*path, name))


def _is_numeric(param: click.Parameter) -> bool:
    return isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))


def numeric_options() -> list[NumericOption]:
    """Every parameter of either command line whose type is a number (int, float, IntRange, FloatRange, ...)."""
    found = []
    for name, root in (("kombu-ladder", cli), ("celery ladder", ladder)):
        for path, command in _commands(root):
            found += [NumericOption(name, path, command, p) for p in command.params if _is_numeric(p)]
    return found


OPTIONS = numeric_options()


def _sample(param: click.Parameter) -> str:
    """A value ``param`` accepts, to fill in the other required parameters of a command line."""
    if isinstance(param.type, Number):
        return str(param.type.max)
    if isinstance(param.type, click.Choice):
        return str(param.type.choices[0])
    return "amqp://x//" if param.name == "to" else "x"


def _argv(option: NumericOption, value: str) -> list[str]:
    """The command line that gives ``value`` to ``option``, its command's required parameters filled in."""
    args = [*option.path]
    opt = option.param
    if isinstance(opt, click.Option):
        args += [f"{opt.opts[0]}={value}"]  # "=" so that "-1" is the value, not an option
    others = [p for p in option.command.params if p is not opt and p.required]
    for other in others:
        if isinstance(other, click.Option):
            args += [other.opts[0], _sample(other)]
    positional = [p for p in option.command.params if isinstance(p, click.Argument) and (p is opt or p.required)]
    if positional:
        args.append("--")
        args += [value if p is opt else _sample(p) for p in positional]
    return args


def run(option: NumericOption, value: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the command line in this process; return its exit status, stdout and stderr."""
    argv = _argv(option, value)
    if option.cli == "kombu-ladder":
        code = main(["--broker", UNREACHABLE, *argv])
        out, err = capsys.readouterr()
        return code, out, err
    from celery.bin.celery import celery

    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click 8.1
    except TypeError:  # click 8.2+ keeps stderr apart always
        runner = CliRunner()
    with mock.patch.dict(os.environ):  # celery's command sets CELERY_BROKER_URL (and more) in os.environ
        result = runner.invoke(celery, ["-b", UNREACHABLE, "ladder", *argv], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def assert_refused(option: NumericOption, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(option, value, capsys)
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (2, "", 1), (option.id, value, code, out, err)
    name = option.param.opts[0] if isinstance(option.param, click.Option) else option.param.human_readable_name
    assert lines[0].startswith(f"Error: Invalid value for '{name}': "), lines[0]
    assert "Traceback" not in err


def test_the_table_reads_both_command_lines() -> None:
    """The enumeration finds the options it must: if it found none, every test below would pass vacuously."""
    ids = {o.id for o in OPTIONS}
    assert {"kombu-ladder relay --hold-window", "kombu-ladder relay --max-delay", "kombu-ladder relay --prefetch",
            "kombu-ladder relay --metrics-interval", "kombu-ladder status --parked", "kombu-ladder find --limit",
            "kombu-ladder check --min-relays", "celery ladder status --timeout", "celery ladder relay --prefetch",
            "celery ladder show --limit"} <= ids


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.id)
def test_every_numeric_option_is_a_finite_bounded_number(option: NumericOption) -> None:
    """One type validates them all (``kombu_ladder.cli.options.Number``): finite, with both bounds."""
    assert isinstance(option.param.type, Number), (
        f"{option.id} is a plain {type(option.param.type).__name__}: use kombu_ladder.cli.options.Number, "
        "which refuses nan, inf and absurd values")


@pytest.mark.parametrize("value", ALWAYS_BAD)
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.id)
def test_a_bad_value_is_one_usage_line(option: NumericOption, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(option, value, capsys)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.id)
def test_zero_is_refused_unless_the_help_says_what_it_means(option: NumericOption,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    number = option.param.type
    assert isinstance(number, Number)
    help_text = getattr(option.param, "help", "") or ""
    zero_allowed = number.min == 0 and not number.min_open
    assert zero_allowed == bool(re.search(r"\b0: ", help_text)), (
        f"{option.id}: 0 is {'accepted' if zero_allowed else 'refused'}; an option that takes 0 says what it "
        f"means in its help ('0: ...'), and one that does not refuses it. Help: {help_text!r}")
    if not zero_allowed:
        assert_refused(option, "0", capsys)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.id)
def test_the_default_and_the_bounds_are_accepted(option: NumericOption) -> None:
    number = option.param.type
    assert isinstance(number, Number)
    assert number.min is not None and number.max is not None
    accepted = [number.max] if number.max_open is False else []
    if not number.min_open:
        accepted.append(number.min)
    if option.param.default is not None:
        accepted.append(option.param.default)
    for value in accepted:
        converted = number.convert(str(int(value) if number.integer else value), option.param, None)
        assert converted == value and isinstance(converted, int if number.integer else float)


@pytest.mark.parametrize("given,shown", [
    (["relay", "--hold-window", "nan"], "'--hold-window': nan is not a finite number."),
    (["relay", "--max-delay", "1e400"], "'--max-delay': 1e400 is not a finite number."),
    (["relay", "--metrics-port", "0", "--metrics-interval", "nan"], "'--metrics-interval': nan is not a finite"),
    (["relay", "--report-every", "nan"], "'--report-every': nan is not a finite number."),
    (["relay", "--prefetch", "2.5"], "'--prefetch': '2.5' is not a whole number."),
])
def test_the_reported_inputs_name_the_option(given: list[str], shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--broker", UNREACHABLE, *given]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"Error: Invalid value for {shown}") and err.count("\n") == 1, err


def test_a_status_timeout_of_1e9_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    (timeout,) = [o for o in OPTIONS if o.id == "celery ladder status --timeout"]
    assert_refused(timeout, "1e9", capsys)
    assert_refused(timeout, "0", capsys)


@pytest.mark.parametrize("value", ["", "x" * 256, "é" * 128])
@pytest.mark.parametrize("argv", [["cancel", "--"], ["find", "--"]])
def test_an_id_no_message_can_have_is_one_usage_line_for_cancel_and_find(
        argv: list[str], value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``cancel ""`` and ``find ""`` answer the same: before connecting, naming the argument."""
    assert main(["--broker", UNREACHABLE, *argv, value]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert re.match(r"Error: Invalid value for '(ID\.\.\.|ID)': an id (must not be empty|is longer than 255)", err), err


def test_every_id_argument_uses_the_message_id_type() -> None:
    for name, root in (("kombu-ladder", cli), ("celery ladder", ladder)):
        for path, command in _commands(root):
            for param in command.params:
                if isinstance(param, click.Argument) and re.search(r"id", param.name or "", re.I):
                    assert isinstance(param.type, MessageId), f"{name} {' '.join(path)} {param.name}"


def test_version_prints_the_distributions_version(capsys: pytest.CaptureFixture[str]) -> None:
    from kombu_ladder import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"kombu-ladder {__version__}\n"


@pytest.mark.parametrize("value,shown", [
    ("nan", "is not a time: seconds from now"),
    ("999999999999", "is longer than the maximum delay"),
    ("soon", "is not a time: seconds from now"),
    ("2h30", "UTC when it gives no offset"),
    ("2100-01-01T00:00:00Z", "is longer than the maximum delay"),
    ("2100-01-01T00:00:00", "is longer than the maximum delay"),
])
@pytest.mark.parametrize("argv", [["reschedule", "some-id"]])
def test_a_bad_reschedule_time_is_one_usage_line_naming_when(argv: list[str], value: str, shown: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before connecting: the move never reads a time it cannot honour."""
    assert main(["--broker", UNREACHABLE, *argv, value]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("Error: Invalid value for 'WHEN': "), err
    assert shown in err, err


@pytest.mark.parametrize("when", ["-30", "-30s", "+10m", "2h30m", "2026-12-24T17:00"])
def test_reschedule_reads_a_negative_or_unit_time_without_a_double_dash(when: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """WHEN is read (the move would connect next: exit 69, the broker is unreachable), never a usage error."""
    assert main(["--broker", UNREACHABLE, "reschedule", "some-id", when]) == 69
    assert "Could not connect" in capsys.readouterr().err
    assert main(["--broker", UNREACHABLE, "reschedule", "some-id", when, "--lmit", "3"]) == 2, \
        "a mistyped option is still a usage error"


def _help_options(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The option flags a command's --help lists, in order."""
    if argv[0] == "kombu-ladder":
        assert main([*argv[1:], "--help"]) == 0
        text = capsys.readouterr().out
    else:
        from celery.bin.celery import celery

        with mock.patch.dict(os.environ):
            result = CliRunner().invoke(celery, ["ladder", *argv[1:], "--help"])
        assert result.exit_code == 0, result.output
        text = result.output
    return re.findall(r"^  (?:-\w, )?(--[a-z][a-z-]*)", text, re.M)


#: Options only ``celery ladder`` has (the workers' replies), beside the shared ones.
CELERY_ONLY = {"status": ["--timeout"], "web": ["--timeout"]}


@pytest.mark.parametrize("path", [path for path, command in _commands(cli) if path and path != ("waiting",)],
                         ids=" ".join)
def test_both_command_lines_list_the_same_options_for_every_shared_command(
        path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    ours = _help_options(["kombu-ladder", *path], capsys)
    theirs = _help_options(["celery", *path], capsys)
    assert ours, path
    assert theirs == ours[:-1] + CELERY_ONLY.get(path[0], []) + ours[-1:], (path, ours, theirs)  # --help last


def test_celery_ladder_runs_the_same_command_objects_and_keeps_show_as_an_alias_of_find() -> None:
    for path, command in _commands(cli):
        if len(path) == 1 and path[0] not in CELERY_ONLY:
            assert ladder.commands[path[0]] is command, path
    assert ladder.commands["show"].callback is cli.commands["find"].callback
    assert {"adopt", "move", "replay"} <= set(ladder.commands)


@pytest.mark.parametrize("flag", ["--hold-capacity", "--max-refusals", "--hold-window", "--allow-exchange"])
def test_every_relay_option_is_on_both_command_lines(flag: str) -> None:
    for root in (cli, ladder):
        assert flag in [o for p in root.commands["relay"].params for o in p.opts]


def test_a_relay_option_comes_from_the_command_line_then_the_environment_then_the_setting_then_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    from types import SimpleNamespace

    from celery import Celery

    from kombu_ladder.cli import commands

    seen: dict[str, object] = {}
    monkeypatch.setattr(commands, "relay", lambda connection, *, options, **kw: seen.update(options=options, **kw))
    monkeypatch.setattr(commands, "connected", lambda connection: contextlib.nullcontext())
    monkeypatch.setattr(commands, "open_connection", lambda url: contextlib.nullcontext())
    app = Celery("precedence", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.update(ladder_hold_window="30s", ladder_max_refusals=2, ladder_hold_capacity=9, ladder_queue_type="quorum")
    result = CliRunner().invoke(ladder, ["relay", "--hold-capacity", "7"], obj=SimpleNamespace(app=app),
                                env={"KOMBU_LADDER_MAX_REFUSALS": "3"})
    assert result.exit_code == 0, result.output
    options = seen["options"]
    assert (options.hold_capacity, options.max_refusals, options.hold_window, options.prefetch) == (7, 3, 30.0, 50)
    assert seen["queue_type"] == "quorum"
    monkeypatch.setenv("KOMBU_LADDER_HOLD_WINDOW", "2m")
    assert main(["relay", "--max-refusals", "0"]) == 0
    options = seen["options"]
    assert (options.hold_window, options.max_refusals, options.hold_capacity) == (120.0, 0, 2000)
    assert seen["queue_type"] is None, "kombu-ladder: the profile the ladder is declared with"
    from celery_ladder.settings import LadderSettings

    assert LadderSettings.from_conf({"ladder_hold_window": 5}).hold_window == 120.0, "a worker's relay reads it too"


@pytest.mark.parametrize("command,table", [("relay", "TUNABLES"), ("web", "CONSOLE")])
def test_the_numeric_options_take_their_bounds_from_the_one_table(command: str, table: str) -> None:
    from kombu_ladder import tuning

    declared = getattr(tuning, table)
    for root in (cli, ladder):
        params = {p.name: p for p in root.commands[command].params}
        for name, tunable in declared.items():
            if table == "TUNABLES":
                assert name in params, f"relay option {name} is not on the command line"
            if tunable.kind in ("count", "seconds") and name in params:  # the console's last two: Python only
                number = params[name].type
                assert isinstance(number, Number), name
                assert (number.min, number.max, number.min_open) == (tunable.least, tunable.most, tunable.least_open)
                assert (number.integer, params[name].opts[0]) == (tunable.kind == "count", tunable.option), name
