"""``make dist``: the sdist and the wheel pass ``twine check``, install into clean virtualenvs, one per extra, and the
quickstarts run from there as the quickstart page shows them.

``make dist`` builds into ``dist/`` and points ``LADDER_DIST`` at it, so these tests check what it built; run
alone, they build their own. Nothing of the checkout is importable in those virtualenvs: the examples are
copied out and run with the virtualenv's interpreter, so an import that works only from the checkout fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from docs_blocks import blocks, commands_of
from figures import differences
from helpers import build_distribution, extra_requirement, queue_depth, vhost_url, wait_for
from kombu import Connection

from kombu_ladder import __version__

ROOT = Path(__file__).resolve().parents[2]

#: Where ``make dist`` put what it built (else the tests build their own).
DIST_ENV = "LADDER_DIST"

#: The extras a user installs, each into a virtualenv of its own ("" is kombu-ladder alone).
EXTRAS = ("", "celery", "django", "prometheus", "web")

#: Renders every template of the web console from the installed package and reads its stylesheet: the wheel ships
#: them (package data), and the extra brings what they need.
WEB_ASSETS = """
from importlib import resources
from kombu_ladder.web.app import _environment
env = _environment()
names = sorted(env.list_templates())
assert "base.html" in names and "overview.html" in names, names
assert resources.files("kombu_ladder.web").joinpath("static/console.css").read_text().startswith("/*")
import uvicorn, starlette
print(len(names))
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get(DIST_ENV)
    if given:
        return Path(given).resolve()
    out = tmp_path_factory.mktemp("dist")
    done = build_distribution(out, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    (found,) = dist.glob(pattern)
    return found


@pytest.fixture(scope="module")
def venvs(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``{extra: bin directory}``: a fresh virtualenv per extra, the wheel installed with it (pip's cache and the
    machine's package index make the installs quick)."""
    made: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("venvs")
    wheel = _one(dist, f"kombu_ladder-{__version__}-py3-none-any.whl")
    for extra in EXTRAS:
        home = root / (extra or "base")
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120)
        spec = f"{wheel}[{extra}]" if extra else str(wheel)
        done = subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", spec],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        made[extra] = home / "bin"
    yield made


def run(bin_dir: Path, *argv: str, cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``argv`` with the virtualenv's bin/ first on PATH (as if activated) and no PYTHONPATH from the checkout."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environ.update(PATH=os.pathsep.join([str(bin_dir), environ["PATH"]]), **env)
    return subprocess.run(list(argv), cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A copy of examples/, away from the checkout."""
    return Path(shutil.copytree(ROOT / "examples", tmp_path / "examples",
                                ignore=shutil.ignore_patterns("__pycache__")))


@pytest.mark.process
def test_twine_checks_the_sdist_and_the_wheel(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert [Path(f).name for f in files] == [f"kombu_ladder-{__version__}-py3-none-any.whl",
                                             f"kombu_ladder-{__version__}.tar.gz"]
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


@pytest.mark.process
@pytest.mark.timeout(900)
@pytest.mark.parametrize("extra", EXTRAS)
def test_the_wheel_installs_alone_and_with_each_extra(extra: str, venvs: dict[str, Path], tmp_path: Path) -> None:
    bin_dir = venvs[extra]
    version = run(bin_dir, "kombu-ladder", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, f"kombu-ladder {__version__}\n"), version.stderr
    where = run(bin_dir, "python", "-c", "import kombu_ladder; print(kombu_ladder.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(bin_dir.parent)), where.stdout + where.stderr
    celery = run(bin_dir, "python", "-c", "import celery_ladder", cwd=tmp_path)
    if extra in ("celery", "django"):
        assert celery.returncode == 0, celery.stderr
    else:  # the hint names what to install
        assert celery.returncode == 1 and extra_requirement("celery") in celery.stderr.splitlines()[-1]
    metrics = run(bin_dir, "python", "-c", "import kombu_ladder.metrics", cwd=tmp_path)
    assert (metrics.returncode == 0) == (extra == "prometheus"), metrics.stderr
    django = run(bin_dir, "python", "-c", "import django", cwd=tmp_path)
    assert (django.returncode == 0) == (extra == "django"), django.stderr
    web = run(bin_dir, "python", "-c", WEB_ASSETS, cwd=tmp_path)
    assert (web.returncode == 0) == (extra == "web"), web.stderr
    if extra == "web":
        assert int(web.stdout) >= 10, web.stdout
    else:  # without the extra, the command says what to install
        refused = run(bin_dir, "kombu-ladder", "web", cwd=tmp_path)
        hint = 'pip install ".[web]" from the root of a kombu-ladder clone'
        assert refused.returncode == 1 and hint in refused.stderr, refused.stderr


@pytest.mark.process
@pytest.mark.timeout(600)
def test_the_sdist_installs_too(dist: Path, tmp_path: Path) -> None:
    home = tmp_path / "sdist-venv"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120)
    sdist = _one(dist, f"kombu_ladder-{__version__}.tar.gz")
    done = run(home / "bin", "python", "-m", "pip", "install", "--quiet", str(sdist), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert run(home / "bin", "kombu-ladder", "--version", cwd=tmp_path).stdout == f"kombu-ladder {__version__}\n"


def _shown(command: str) -> tuple[str, ...]:
    """What the quickstart page shows under ``command``."""
    (shown,) = [c.output for b in blocks("console") if b.page == "quickstart.rst" for c in commands_of(b)
                if c.line == command]
    return shown


@pytest.mark.broker
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", ["kombu_scheduler", "kombu_producer", "kombu_republish"])
def test_the_kombu_quickstarts_run_from_a_clean_install(script: str, venvs: dict[str, Path], examples: Path,
                                                         fresh_vhost: str) -> None:
    """kombu-ladder alone (no extra), as the quickstart page runs each script, printing what the page shows."""
    command = f"python examples/{script}.py"
    done = run(venvs[""], "python", f"examples/{script}.py", cwd=examples.parent, BROKER_URL=vhost_url(fresh_vhost))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    problems = differences(command, _shown(command), done.stdout)
    assert not problems, "\n".join(problems) + "\n" + done.stdout


@pytest.mark.broker
@pytest.mark.celery
@pytest.mark.timeout(600)
def test_the_celery_quickstart_runs_from_a_clean_install(venvs: dict[str, Path], examples: Path,
                                                         fresh_vhost: str, tmp_path: Path) -> None:
    url = vhost_url(fresh_vhost)
    bin_dir = venvs["celery"]
    log = tmp_path / "worker.log"
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environ.update(PATH=os.pathsep.join([str(bin_dir), environ["PATH"]]), BROKER_URL=url)
    with log.open("w") as sink:
        worker = subprocess.Popen(["celery", "-A", "celery_app", "worker", "-P", "ladder", "-n", "quickstart@%h",
                                   "--loglevel=INFO"], cwd=examples, env=environ, stdout=sink,
                                  stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: worker.poll() is None and "ready." in log.read_text(), 90,
                 message="the quickstart worker to start", on_timeout=lambda: log.read_text()[-3000:])
        done = run(bin_dir, "python", "celery_app.py", cwd=examples, BROKER_URL=url)
        assert (done.returncode, done.stdout) == (0, "reminded: pay the invoice\n"), done.stderr[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.broker
@pytest.mark.timeout(600)
def test_the_django_quickstart_runs_from_a_clean_install(venvs: dict[str, Path], examples: Path,
                                                         fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    done = run(venvs["django"], "python", "manage.py", "remind", "renew the policy", "--countdown", "300",
               cwd=examples / "django_project", BROKER_URL=url)
    assert done.returncode == 0, done.stderr[-3000:]
    command = 'python manage.py remind "renew the policy" --countdown 300'
    assert not differences(command, _shown(command), done.stdout), done.stdout
    with Connection(url) as conn:  # 300 s goes into the 1-minute rung first
        wait_for(lambda: queue_depth(conn, "acemq.schedule.1m", if_missing=0) == 1, 30,
                 message="the task in the 1m rung")
