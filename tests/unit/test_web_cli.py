"""``kombu-ladder web`` and ``celery ladder web`` refuse an unsafe console before they connect to anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kombu_ladder.cli import main
from kombu_ladder.cli.console import E_EXTRA, console_options

#: No broker listens here, and none is reached: every refusal comes before connecting.
NOWHERE = "amqp://guest:guest@127.0.0.1:1//"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["web", "--broker", NOWHERE, *args])
    return code, capsys.readouterr().err


def test_a_non_loopback_host_without_credentials_is_refused(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KOMBU_LADDER_WEB_PASSWORD", raising=False)
    monkeypatch.delenv("KOMBU_LADDER_WEB_TOKEN", raising=False)
    code, err = _run(capsys, "--host", "0.0.0.0")
    assert code == 2
    assert err.startswith("Error: --host 0.0.0.0 is not a loopback address") and "--token-file" in err


def test_a_short_secret_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("hunter2\n")
    code, err = _run(capsys, "--host", "0.0.0.0", "--token-file", str(secret))
    assert code == 2 and "--token-file: the secret must be at least 16 characters (it has 7)" in err


def test_a_secret_from_the_environment_counts(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOMBU_LADDER_WEB_PASSWORD", "short")
    code, err = _run(capsys, "--host", "0.0.0.0")
    assert code == 2 and "$KOMBU_LADDER_WEB_PASSWORD: the secret must be at least 16" in err
    monkeypatch.setenv("KOMBU_LADDER_WEB_PASSWORD", "correct horse battery staple\n")
    options = console_options(host="0.0.0.0", port=8642, read_only=False, user="ops", password_file=None,
                              token_file=None, refresh=5.0, page_size=50, look_limit=10)
    assert (options.auth.user, options.auth.password, options.auth.token) == ("ops", "correct horse battery staple",
                                                                              None)


def test_options_out_of_range_name_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "--refresh", "0.5")
    assert code == 2 and "'--refresh'" in err


def test_without_the_extra_it_says_what_to_install(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_uvicorn(name: str, *args: object, **kwargs: object) -> object:
        if name == "uvicorn":
            raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    code, err = _run(capsys)
    assert code == 1 and E_EXTRA.format(missing="uvicorn") in err


def test_celery_ladder_web_refuses_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.bin.celery import celery

    monkeypatch.delenv("KOMBU_LADDER_WEB_PASSWORD", raising=False)
    monkeypatch.delenv("KOMBU_LADDER_WEB_TOKEN", raising=False)
    monkeypatch.setenv("CELERY_BROKER_URL", NOWHERE)  # celery -b sets it for the process: undone after the test
    done = CliRunner().invoke(celery, ["-b", NOWHERE, "ladder", "web", "--host", "0.0.0.0"])
    assert done.exit_code == 2, done.output
    assert "--host 0.0.0.0 is not a loopback address" in done.output
