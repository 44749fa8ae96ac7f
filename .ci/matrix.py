"""make test-matrix: the Celery tier and the Django tests in one virtualenv per supported stack.

Each stack pins a Python, Celery with its own kombu (and py-amqp for the oldest), and
Django. Its virtualenv lives in .matrix/<stack>/ and is reused while the pins, the
interpreter and setup.cfg are unchanged; pip's cache makes a cold build quick. Every
stack installs ladder the way a user would, ``pip install -e .[celery,test,django]`` beside
the pinned versions in ONE resolver call, so a range in setup.cfg that refuses a pin
fails the stack. Then it runs the real-worker tests (tests/celery_tier and every other
``celery``-marked test file), the Django tests and the kombu producer tests that differ
by kombu release. One line per stack: verdict, versions, wall time.

Usage: python3 .ci/matrix.py [stack ...]   (or STACKS="celery5.3 celery5.7" make test-matrix)
MATRIX_JOBS=2 runs two stacks at once; MATRIX_PYTEST_ARGS adds pytest arguments to each stack's run
(CI: ``-n 2 --dist loadgroup``, each stack's tests on two xdist workers).
"""

from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".matrix"


@dataclass(frozen=True)
class Stack:
    """One supported combination."""

    name: str
    python: str  #: major.minor; the newest pyenv patch release installed is used
    pins: tuple[str, ...]


#: Celery 5.3-5.7 each with its own kombu; Django 4.2, 5.2 and 6.1; Python 3.9 (oldest
#: declared), 3.10, 3.11, 3.12 and 3.13 (newest). Django 6 needs Python >= 3.12. The oldest
#: stack also pins py-amqp's oldest release in our range (5.1.1, kombu 5.3's floor).
STACKS: tuple[Stack, ...] = (
    Stack("celery5.3", "3.9", ("celery==5.3.6", "kombu==5.3.7", "amqp==5.1.1", "django==4.2.30")),
    Stack("celery5.4", "3.11", ("celery==5.4.0", "kombu==5.4.2", "django==4.2.30")),
    Stack("celery5.5", "3.10", ("celery==5.5.3", "kombu==5.5.4", "django==5.2.19")),
    Stack("celery5.6", "3.12", ("celery==5.6.3", "kombu==5.6.2", "django==6.1.3")),
    Stack("celery5.7", "3.13", ("celery==5.7.0", "kombu==5.7.0", "django==6.1.3")),
)

#: Test files every stack runs whole: Django, the examples, both command lines (click differs by
#: Python: 8.1 is the newest for 3.9), the kombu-facing producer (its encoded rung messages are checked against
#: each py-amqp's own encoder, and what kombu's publish does around the channel call differs by release) and the
#: publish path's reading of
#: Celery's settings object (its lookup differs by Celery release, and by Python: 3.12's UserDict.get).
#: Elsewhere a stack runs the
#: celery-marked tests only (tests/process/test_docs.py, for one, builds wheels for its other tests).
ALWAYS = ("tests/celery_tier", "tests/process/test_cli.py", "tests/process/test_examples.py",
          "tests/sim/test_simulator_celery.py", "tests/sim/test_celery_worker_composition.py",
          "tests/broker/test_producer.py", "tests/broker/test_long_delays.py",
          "tests/unit/test_publish_path.py", "tests/broker/test_producer_wire.py",
          "tests/unit/test_encoded_properties.py")

#: Left out of every stack: the first hour is what the README installs (the newest Celery); an older Celery
#: prints deprecation warnings of its own settings (5.3: broker_connection_retry), which are not the ladder's.
#: The distribution's tests install the wheel into clean virtualenvs of their own, with the newest Celery
#: whatever the stack pins: a stack would only repeat ``make test``'s run (and build the distribution in the
#: checkout beside it).
LEFT_OUT = ("tests/process/test_first_hour.py", "tests/process/test_dist.py")


def find_python(version: str) -> Optional[str]:
    """Return the interpreter for ``version`` (e.g. "3.12"): pyenv's newest patch release, else PATH."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.rsplit("/versions/", 1)[1])])
    if found:
        return found[-1]
    return shutil.which(f"python{version}")


def fingerprint(stack: Stack, python: str) -> str:
    """What a reusable virtualenv must match: interpreter, pins and the install metadata."""
    digest = hashlib.sha256()
    digest.update(json.dumps([python, stack.pins]).encode())
    digest.update((ROOT / "setup.cfg").read_bytes())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


#: Seconds one pip install may take: a resolver that backtracks gives up long after this.
INSTALL_TIMEOUT = 600
#: Seconds one stack's tests may take: in CI's matrix lane (two stacks at once, beside three other
#: lanes on two cores) a stack took 766-1,062 s, and up to 1,300 s when the machine was busier still.
TEST_TIMEOUT = 2400


def run(cmd: list[str], log: Path, *, timeout: float, env: Optional[dict[str, str]] = None) -> int:
    """Run ``cmd`` in the repository with its output appended to ``log``; 124 on a timeout."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout:g}s\n")
            return 124


def installed_versions(venv: Path, names: list[str]) -> dict[str, str]:
    code = ("import json, sys; from importlib.metadata import version; "
            "print(json.dumps({n: version(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(venv / "bin/python"), "-c", code, *names], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def build(stack: Stack, python: str, venv: Path, log: Path) -> Optional[str]:
    """Create (or reuse) the stack's virtualenv; return why it failed, or None."""
    stamp = venv / ".matrix-stamp"
    wanted = fingerprint(stack, python)
    if stamp.exists() and stamp.read_text() == wanted:
        return None
    shutil.rmtree(venv, ignore_errors=True)
    if run([python, "-m", "venv", str(venv)], log, timeout=120):
        return "venv creation failed"
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    if run([*pip, "install", "-q", "--upgrade", "pip"], log, timeout=INSTALL_TIMEOUT):
        return "pip upgrade failed"
    # One resolver call: ladder's ranges must accept every pin, unchanged.
    if run([*pip, "install", "-q", "-e", ".[celery,test,django]", *stack.pins], log, timeout=INSTALL_TIMEOUT):
        return "pip could not install ladder beside these pins (see the log)"
    if run([*pip, "check"], log, timeout=120):
        return "pip check found broken requirements"
    pinned = dict(pin.split("==") for pin in stack.pins)
    got = installed_versions(venv, list(pinned))
    if got != pinned:
        return f"installed {got}, pinned {pinned}"
    stamp.write_text(wanted)
    return None


def test_paths(venv: Path, log: Path) -> list[str]:
    """ALWAYS, plus each celery-marked test elsewhere (the faults suite has its own target)."""
    out = subprocess.run([str(venv / "bin/python"), "-m", "pytest", "--collect-only", "-q", "-m", "celery",
                          "-p", "no:cacheprovider", "tests", "--ignore=tests/faults", "--ignore=tests/cluster"],
                         cwd=ROOT, capture_output=True, text=True)
    with log.open("a") as f:
        f.write(out.stdout[-2000:] + out.stderr[-2000:])
    marked = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    return [*ALWAYS, *(node for node in marked if not node.startswith(ALWAYS + LEFT_OUT))]


def summary(log: Path) -> str:
    """pytest's closing line, without its timing."""
    lines = [line for line in log.read_text().splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return re.sub(r"\s+in [\d.]+s.*$", "", lines[-1].strip("= ")) if lines else "no pytest summary"


def failures(log: Path, limit: int = 10) -> list[str]:
    """pytest's ``-ra`` lines for what failed or errored, so CI's own output names the test."""
    found = [line.strip() for line in log.read_text(errors="replace").splitlines()
             if line.startswith(("FAILED ", "ERROR "))]
    return found[:limit]


def run_stack(stack: Stack) -> tuple[str, str, list[str]]:
    """Build the stack's virtualenv and run its tests; return (verdict, its line, lines to print under it)."""
    t0 = time.monotonic()
    log = HOME / f"{stack.name}.log"
    log.write_text("")
    venv = HOME / stack.name
    python = find_python(stack.python)
    if python is None:
        verdict, detail, build_s = "FAIL", f"no Python {stack.python} found", 0.0
    else:
        problem = build(stack, python, venv, log)
        build_s = time.monotonic() - t0
        if problem:
            verdict, detail = "FAIL", problem
        else:
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
            code = run([str(venv / "bin/python"), "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
                        *shlex.split(os.environ.get("MATRIX_PYTEST_ARGS", "")), *test_paths(venv, log)],
                       log, env=env, timeout=TEST_TIMEOUT)
            verdict, detail = ("PASS" if code == 0 else "FAIL"), summary(log)
    wall = time.monotonic() - t0
    versions = " ".join(stack.pins).replace("==", " ")
    line = (f"{stack.name:<10} {verdict}  python {stack.python:<5} {versions:<58} {detail:<28} "
            f"install {build_s:5.0f}s  wall {wall:5.0f}s")
    notes = [] if verdict == "PASS" else [*(f"{failed[:300]}" for failed in failures(log)), f"log: {log}"]
    return verdict, line, notes


def main(argv: list[str]) -> int:
    chosen = set(argv) or set(os.environ.get("STACKS", "").split()) or {s.name for s in STACKS}
    unknown = chosen - {s.name for s in STACKS}
    if unknown:
        print(f"unknown stack(s) {sorted(unknown)}; known: {[s.name for s in STACKS]}")
        return 2
    #: Stacks run at once (MATRIX_JOBS; each has its own virtualenv and its tests their own vhosts).
    jobs = max(1, int(os.environ.get("MATRIX_JOBS", "1") or 1))
    HOME.mkdir(exist_ok=True)
    results = []
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        running = [pool.submit(run_stack, stack) for stack in STACKS if stack.name in chosen]
        for future in concurrent.futures.as_completed(running):
            verdict, line, notes = future.result()
            print(line, flush=True)
            for note in notes:
                print(f"           {note}", flush=True)
            results.append((verdict, line))
    results.sort(key=lambda result: result[1])
    failed = sum(verdict != "PASS" for verdict, _ in results)
    total = time.monotonic() - started
    print(f"matrix: {len(results) - failed} of {len(results)} stacks passed in {total:.0f}s ({jobs} at once)",
          flush=True)
    (HOME / "results.txt").write_text("\n".join(line for _, line in results) + f"\ntotal {total:.0f}s\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
