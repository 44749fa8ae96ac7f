"""make test-celery-upstream: Celery's own integration tests, plain and with the ladder; any difference fails.

The tests come from the source distribution of the Celery release installed in the
running interpreter (the sdist on the package index carries ``t/``). They run in a
virtualenv of their own in ``build/upstream/`` that sees this one's packages (a
``.pth`` file) and adds what Celery's suite needs and ours does not (the Redis client,
pydantic, pytest-rerunfailures, pytest-subtests, at the release's own pins). The
broker is the test RabbitMQ (a fresh vhost per run); the result backend is the Redis
at 127.0.0.1:6379 (``LADDER_UPSTREAM_REDIS``; its database is emptied before each run).

The subset: from ``t/integration/test_tasks.py`` and ``test_canvas.py``, every test
whose code, or the code of a task it names (``t/integration/tasks.py``), mentions
countdown, eta, retry, expires or revoke, but for :data:`EXCLUDED`. It runs twice, plain and with
``celery_ladder.install`` on every app and the relay in the suite's worker
(``tests/upstream/ladder_upstream.py``), and the outcome of every test must be the
same. The tests that fail in both runs, and why, are in ``tests/upstream/README.md``.

Usage: python tests/upstream/run.py [--all] [pytest args...]   (--all: every test of both files)
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import uuid
import xml.etree.ElementTree as ElementTree
from importlib import metadata
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BUILD = ROOT / "build" / "upstream"

#: The files the subset is taken from, and what a test must mention (itself, or a task it names).
FILES = ("t/integration/test_tasks.py", "t/integration/test_canvas.py")
KEYWORDS = re.compile(r"countdown|\beta\b|retry|retries|expires|revoke")
#: Tests of the subset left out, and why (a prefix of the node id: every parametrization).
EXCLUDED = {
    "t/integration/test_tasks.py::test_tasks::test_revoked_by_headers_complex_canvas":
        "revokes by stamped headers, no countdown; a minute per run and flaky (rerun) with and without the ladder",
}
#: What Celery's suite needs beyond this virtualenv: requirement lines of the release's own files.
EXTRA_FILES = ("requirements/extras/redis.txt", "requirements/extras/pydantic.txt")
EXTRA_TEST_PACKAGES = ("pytest-rerunfailures", "pytest-subtests")

BROKER_HOST = os.environ.get("LADDER_TEST_HOST", "127.0.0.1")
BROKER_PORT = os.environ.get("LADDER_TEST_PORT", "5672")
REDIS = os.environ.get("LADDER_UPSTREAM_REDIS", "redis://127.0.0.1:6379/0")
#: Seconds one run may take at most.
RUN_TIMEOUT = 1800


def log(text: str) -> None:
    print(f"[upstream] {text}", flush=True)


def sdist(version: str) -> Path:
    """The release's source tree (``t/``, ``requirements/``, ``pyproject.toml``), downloaded once."""
    tree = BUILD / f"celery-{version}"
    if (tree / "t" / "integration").is_dir():
        return tree
    BUILD.mkdir(parents=True, exist_ok=True)
    archive = BUILD / f"celery-{version}.tar.gz"
    if not archive.exists():
        log(f"downloading the source distribution of celery {version}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"celery=={version}", "-d", str(BUILD)], check=True)
    prefix = f"celery-{version}/"
    wanted = (f"{prefix}t/", f"{prefix}requirements/", f"{prefix}pyproject.toml", f"{prefix}setup.cfg")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted) and (m.isfile() or m.isdir())]
        tar.extractall(BUILD, members=members)  # noqa: S202 - the package index's own sdist, these paths only
    return tree


def requirements(tree: Path, kombu: str) -> list[str]:
    """What the suite needs and this virtualenv lacks, pinned as the release's requirement files pin it."""
    wanted: list[str] = []
    for name in EXTRA_FILES:
        for line in (tree / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("kombu["):  # the extra of the kombu installed here, not another kombu
                line = f"{line.split(']')[0]}]=={kombu}"
            if line and not line.startswith("-r"):
                wanted.append(line)
    test = (tree / "requirements" / "test.txt").read_text().splitlines()
    for package in EXTRA_TEST_PACKAGES:
        wanted += [line.split("#")[0].strip() for line in test if re.match(rf"{package}\s*[=<>!~]", line)]
    return wanted


def virtualenv(tree: Path, version: str) -> Path:
    """A virtualenv that sees this one's packages and adds the suite's requirements; rebuilt when they change."""
    kombu = metadata.version("kombu")
    wanted = requirements(tree, kombu)
    fingerprint = hashlib.sha256(json.dumps([sys.executable, version, kombu, wanted]).encode()).hexdigest()
    env = BUILD / f"venv-{version}"
    python = env / "bin" / "python"
    stamp = env / ".ladder-fingerprint"
    if stamp.exists() and stamp.read_text() == fingerprint and python.exists():
        return python
    log(f"building {env.relative_to(ROOT)}: {', '.join(wanted)}")
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # as a site directory, so that its own .pth files (the editable install of the ladder) are read too
    parent = sysconfig.get_paths()["purelib"]
    (Path(site) / "ladder_parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted], check=True)
    stamp.write_text(fingerprint)
    return python


def select(tree: Path, everything: bool) -> list[str]:
    """The node ids of the subset (see the module docstring), in file order."""
    tasks_source = (tree / "t" / "integration" / "tasks.py").read_text()
    named = [node.name for node in ast.parse(tasks_source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
             and KEYWORDS.search(ast.get_source_segment(tasks_source, node) or "")]
    mentions = re.compile(r"\b(" + "|".join(map(re.escape, named)) + r")\b") if named else KEYWORDS
    ids = []
    for name in FILES:
        source = (tree / name).read_text()
        for node in ast.parse(source).body:
            tests = ([(f"{node.name}::", item) for item in node.body] if isinstance(node, ast.ClassDef)
                     else [("", node)])
            for prefix, item in tests:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) or not item.name.startswith("test"):
                    continue
                code = ast.get_source_segment(source, item) or ""
                test_id = f"{name}::{prefix}{item.name}"
                if everything or (test_id not in EXCLUDED and (KEYWORDS.search(code) or mentions.search(code))):
                    ids.append(test_id)
    return ids


def rabbitmqctl(*args: str, check: bool = True) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=check, capture_output=True, timeout=120)


def run(python: Path, tree: Path, ids: list[str], mode: str, extra: list[str]) -> tuple[dict[str, str], dict]:
    """Run the subset once; return each test's outcome and, with the ladder, what the ladder did."""
    vhost = f"ladder-upstream-{mode}-{uuid.uuid4().hex[:6]}"
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    junit = BUILD / f"{mode}.xml"
    report = BUILD / f"{mode}-ladder.json"
    for path in (junit, report):
        path.unlink(missing_ok=True)
    env = dict(os.environ, TEST_BROKER=f"pyamqp://guest:guest@{BROKER_HOST}:{BROKER_PORT}/{vhost}",
               TEST_BACKEND=REDIS, LADDER_UPSTREAM_REPORT=str(report),
               PYTHONPATH=os.pathsep.join([str(HERE), str(tree)]))
    env.pop("CELERY_CONFIG_MODULE", None)
    plugin = ["-p", "ladder_upstream"] if mode == "ladder" else []
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}",
               *plugin, *extra, *ids]
    flushed = subprocess.run([str(python), "-c", f"import redis; redis.Redis.from_url({REDIS!r}).flushdb()"],
                             capture_output=True, text=True)
    if flushed.returncode:
        raise SystemExit(f"Redis at {REDIS} cannot be used (Celery's integration suite keeps its results there; "
                         f"LADDER_UPSTREAM_REDIS names another): {flushed.stderr.strip().splitlines()[-1]}")
    log(f"{mode}: {len(ids)} tests on vhost {vhost}")
    started = time.monotonic()
    try:
        subprocess.run(command, cwd=tree, env=env, timeout=RUN_TIMEOUT)
    finally:
        rabbitmqctl("delete_vhost", vhost, check=False)
    log(f"{mode}: done in {time.monotonic() - started:.0f} s")
    if not junit.exists():
        raise SystemExit(f"the {mode} run wrote no report ({junit}): it did not run")
    return outcomes(junit), json.loads(report.read_text()) if report.exists() else {}


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | error | skipped}`` from a JUnit XML report (a subtest failure counts)."""
    found: dict[str, str] = {}
    order = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    for case in ElementTree.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        if order[outcome] >= order[found.get(test_id, "passed")]:
            found[test_id] = outcome
    return found


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    everything = "--all" in args
    args = [a for a in args if a != "--all"]
    version = metadata.version("celery")
    started = time.monotonic()
    tree = sdist(version)
    python = virtualenv(tree, version)
    ids = select(tree, everything)
    results = {mode: run(python, tree, ids, mode, args) for mode in ("plain", "ladder")}
    (plain, _), (ladder, did) = results["plain"], results["ladder"]
    tally = {mode: {o: list(r[0].values()).count(o) for o in ("passed", "failed", "error", "skipped")}
             for mode, r in results.items()}
    log(f"celery {version}, {len(ids)} tests selected; plain {tally['plain']}; ladder {tally['ladder']}")
    log(f"the ladder: {json.dumps(did, sort_keys=True)}")
    baseline = sorted(t for t, o in plain.items() if o in ("failed", "error"))
    for test_id in baseline:
        log(f"fails without the ladder too: {test_id} ({plain[test_id]})")
    differ = sorted(t for t in set(plain) | set(ladder) if plain.get(t) != ladder.get(t))
    for test_id in differ:
        log(f"DIFFERS: {test_id}: plain {plain.get(test_id, 'absent')}, ladder {ladder.get(test_id, 'absent')}")
    engaged = did.get("scheduled", 0) > 0 and did.get("relay", {}).get("delivered", 0) > 0
    if not engaged:
        log("the ladder did not engage (nothing scheduled or delivered): the comparison would mean nothing")
    log(f"total {time.monotonic() - started:.0f} s")
    return 1 if differ or not engaged or not plain else 0


if __name__ == "__main__":
    sys.exit(main())
