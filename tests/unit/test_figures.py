"""The docs' output comparison: a figure must equal the run's, or be within the tolerance stated for it."""

from __future__ import annotations

import pytest
from figures import differences

SCHEDULER = "python examples/kombu_scheduler.py"


@pytest.mark.parametrize("command,shown,printed,problems", [
    # The quickstart page's stale figures against what a run prints today.
    (SCHEDULER, ["  1.0s  one second", "  3.0s  four seconds", "  7.0s  eight seconds"],
     "  1.0s  one second\n  4.0s  four seconds\n  8.0s  eight seconds\n", 2),
    (SCHEDULER, ["  1.0s  one second", "  4.0s  four seconds"], "  1.1s  one second\n  3.8s  four seconds\n", 0),
    ("celery -A celery_app inspect ladder", ['"hops": 3,', '"received": 4,'], '"hops": 0,\n"received": 1,\n', 2),
    ("celery -A celery_app inspect ladder", ["->  celery@host: OK"], "->  quickstart@vm: OK\n", 0),
    ("kombu-ladder status", ["acemq.schedule.1h   1204   0"], "acemq.schedule.1h   3   0\n", 1),
    ("kombu-ladder status", ["acemq.schedule.1h   3   0"], "acemq.schedule.1h   3   0\n\n", 0),
    ("python manage.py remind x", ["scheduled 93ddbb61-2fd9-415b-a01e-bc60dd5788b3 in 300s"],
     "scheduled 0a6c0a8e-52d6-4d1b-9f0b-44c6a3a59d0e in 300s\n", 0),
    ("python manage.py remind x", ["scheduled 93ddbb61-2fd9-415b-a01e-bc60dd5788b3 in 300s"],
     "scheduled 0a6c0a8e-52d6-4d1b-9f0b-44c6a3a59d0e in 600s\n", 1),
    ("make demo", ["    1      2s  12:17:35.233   12:17:35.255      +22ms  1s"],
     "    1      2s  01:07:25.837   01:07:25.840       +2ms  1s\n", 0),
    ("make demo", ["    1      2s  12:17:35.233   12:17:35.255      +22ms  1s"],
     "    1      2s  01:07:25.837   01:07:25.940     +103ms  1s\n", 0),
    ("make demo", ["    1      2s  12:17:35.233   12:17:35.255      +22ms  1s"],
     "    1      2s  01:07:25.837   01:07:26.140     +303ms  1s\n", 1),
    ("make demo", ["    1      2s  12:17:35.233   12:17:35.255      +22ms  1s"],
     "    1      2s  01:07:25.837   01:07:25.835       -2ms  1s\n", 1),  # early: never, whatever the tolerance
    ("make demo", ["    1      2s  12:17:35.233   12:17:35.255      +22ms  1s"],
     "    1      2s  01:07:25.837   01:07:25.840       +2ms  10s\n", 1),
    ("kombu-ladder find invoice-42", ["due     2026-12-01T11:02:13.513Z, in 7199.6 s"],
     "due     2026-12-02T01:10:00.001Z, in 7195.2 s\n", 0),
    ("kombu-ladder declare", ["acemq.schedule.1h", "acemq.schedule.10m"], "acemq.schedule.1h\n", 1),
])
def test_differences(command: str, shown: list[str], printed: str, problems: int) -> None:
    found = differences(command, shown, printed)
    assert len(found) == problems, found


def test_a_tolerance_applies_to_its_command_only() -> None:
    """Elapsed seconds may differ by 0.3 s in the quickstarts' output, not in another command's."""
    assert differences(SCHEDULER, ["  1.0s  x"], "  1.2s  x\n") == []
    assert differences("kombu-ladder status", ["  1.0s  x"], "  1.2s  x\n") != []
