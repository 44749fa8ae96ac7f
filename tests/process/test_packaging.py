"""The distribution: named kombu-ladder, Celery an extra, celery_ladder says so when Celery is missing."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points, metadata
from pathlib import Path

import pytest
from helpers import build_distribution, extra_requirement

#: Each test runs a command line or a build in a process of its own (see setup.cfg's markers).
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]

#: What ``import celery_ladder`` says, on its last line, where Celery is not installed.
HINT = ('ModuleNotFoundError: celery_ladder needs the [celery] extra (celery is not installed): '
        'pip install ".[celery]" from the root of a kombu-ladder clone, which brings celery>=5.3,<6')


def without_celery(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``import celery`` fails, as in a kombu-only install."""
    return subprocess.run([sys.executable, "-c", "import sys; sys.modules['celery'] = None\n" + code],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_celery_ladder_without_celery_fails_with_a_one_line_hint() -> None:
    done = without_celery("import celery_ladder")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == HINT
    assert extra_requirement("celery") in HINT, "the hint names the extra's own requirement"


def test_kombu_ladder_its_cli_and_its_pytest_plugin_need_no_celery() -> None:
    done = without_celery(
        "import kombu_ladder, kombu_ladder.cli, kombu_ladder.pytest_plugin as plugin, kombu_ladder.simulator\n"
        "assert plugin.pytest_plugins == [], plugin.pytest_plugins\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('celery', 'celery_ladder') and sys.modules[m]]\n"
        "from kombu_ladder.cli import main\n"
        "raise SystemExit(main(['--help']))\n")
    assert done.returncode == 0, done.stderr
    assert "relay" in done.stdout


def test_the_distribution_is_kombu_ladder_with_celery_and_django_as_extras() -> None:
    meta = metadata("kombu-ladder")
    assert meta["Name"] == "kombu-ladder"
    requires = meta.get_all("Requires-Dist") or []
    base = sorted(r.split(">")[0].split("<")[0].split("=")[0].strip() for r in requires if "extra ==" not in r)
    assert base == ["amqp", "click", "kombu"]

    def extra(name: str) -> set[str]:
        return {r.split(">")[0].split("<")[0].strip() for r in requires if f'extra == "{name}"' in r}

    assert extra("celery") == {"celery"}
    assert extra("django") == {"celery", "django"}
    assert extra("web") == {"starlette", "jinja2", "uvicorn"}
    for name in ("test", "docs", "lint", "bench"):
        assert extra(name), f"the {name} extra is missing"


@pytest.mark.timeout(300)
def test_the_sdist_and_the_wheel_hold_both_packages_and_nothing_stray(tmp_path: Path) -> None:
    done = build_distribution(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = tmp_path.glob("kombu_ladder-*.whl")
    (sdist,) = tmp_path.glob("kombu_ladder-*.tar.gz")
    with zipfile.ZipFile(wheel) as zf:
        in_wheel = set(zf.namelist())
    with tarfile.open(sdist) as tf:
        in_sdist = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    sources = {str(p.relative_to(ROOT)) for package in ("kombu_ladder", "celery_ladder")
               for p in (ROOT / package).rglob("*") if p.is_file() and p.suffix in (".py", ".typed", ".html", ".css")
               and "__pycache__" not in p.parts}
    assert {"kombu_ladder/py.typed", "celery_ladder/py.typed", "kombu_ladder/web/templates/base.html",
            "kombu_ladder/web/static/console.css"} <= sources
    packaged = {name for name in in_wheel if not name.startswith("kombu_ladder-")}
    assert packaged == sources
    entry_points = next(n for n in in_wheel if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheel) as zf:
        assert "kombu-ladder = kombu_ladder.cli:main" in zf.read(entry_points).decode()
    top = {name.split("/", 1)[0] for name in in_sdist if name}
    assert top == {"kombu_ladder", "celery_ladder", "kombu_ladder.egg-info", "README.md", "LICENSE",
                   "CHANGELOG.md", "MANIFEST.in", "PKG-INFO", "setup.cfg", "pyproject.toml"}
    assert sources <= in_sdist


def test_one_distribution_registers_the_pytest_plugin() -> None:
    """A left-over ``ladder`` install or ``ladder.egg-info`` would load the fixtures twice and stop pytest."""
    ours = [(ep.name, ep.value, ep.dist.name if ep.dist else None) for ep in entry_points(group="pytest11")
            if ep.value.split(".")[0] in ("kombu_ladder", "celery_ladder")]
    assert ours == [("kombu_ladder", "kombu_ladder.pytest_plugin", "kombu-ladder")]


def test_every_public_name_is_documented_and_internals_are_not_exported() -> None:
    import celery_ladder
    import kombu_ladder

    api = (ROOT / "docs" / "api.rst").read_text()
    for package in (kombu_ladder, celery_ladder):
        undocumented = [n for n in package.__all__ if f"{package.__name__}.{n}" not in api]
        assert undocumented == [], f"{package.__name__} exports undocumented names: {undocumented}"
    assert not {"RelayCore", "Counters", "describe", "arguments_for"} & set(kombu_ladder.__all__)
    assert not {"LadderAMQP", "LadderTaskProducer", "add_relay_step"} & set(celery_ladder.__all__)
    from kombu_ladder.relay import Counters, RelayCore  # still importable by module path  # noqa: F401


def test_scheduler_on_shows_its_keyword_only_options() -> None:
    import inspect

    from kombu_ladder import Scheduler

    params = inspect.signature(Scheduler.on).parameters
    assert [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] == [
        "relay", "clock", "serializer", "index", "prefetch", "allowed_exchanges", "max_delay", "hold_window",
        "hold_capacity", "hold_bytes", "max_refusals", "queue_type"]
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())


def test_importing_the_packages_creates_nothing_and_install_makes_the_shared_counter() -> None:
    code = (
        "import celery_ladder, celery_ladder.publish as p, kombu_ladder.simulator.registry as r\n"
        "assert p._SCHEDULED is None and not r._kept, 'made on import'\n"
        "from celery import Celery\n"
        "celery_ladder.install(Celery('x', broker='memory://'))\n"
        "assert p._SCHEDULED is not None and p.scheduled_count() == 0\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(600)
def test_builds_of_this_checkout_at_once_all_succeed(tmp_path: Path) -> None:
    """Three at once, as CI's lanes and ``make dist`` may: setuptools makes the sdist's tree in the checkout,
    and without build_distribution's lock one build removes it under another (two of three failed)."""
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda n: build_distribution(tmp_path / str(n), timeout=500), range(3)))
    assert [d.returncode for d in done] == [0, 0, 0], [d.stderr[-2000:] for d in done if d.returncode]
    for n in range(3):
        assert len(list((tmp_path / str(n)).glob("kombu_ladder-*"))) == 2
