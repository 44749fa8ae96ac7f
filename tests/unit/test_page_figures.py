"""Every measured figure a page shows has a source a test checks: the benchmarks page, the code, or a test's bound.

``tests/figures.py`` finds the figures of a page's prose (a number with a unit of
time below a second, memory, a rate, a ratio, decimal seconds, a table cell of
such figures); code blocks are checked by running them (tests/process/test_docs.py).
Each figure found must be covered by an entry of :data:`FIGURES`, which says where
it comes from, and the entry's check must pass:

* :class:`Bench`: quoted from ``docs/benchmarks.md``, which ``make bench`` writes:
  every number of the phrase is in the cited cells of that page's table;
* :class:`Code`: computed by the library (or its tests' corpus): the numbers of the
  phrase are what the code gives, in order;
* :class:`Asserted`: the bound a test asserts: each number is a literal of that test;
* :class:`Label`: a number that is no measurement (a release in a table header, a design's parameter).

So a figure typed into a page without a source fails, and so does a figure whose
source moved (a new benchmark run, a changed constant, a test's new bound).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import pytest
from docs_blocks import DOC_FILES, ROOT
from figures import VARYING, flags, normalized, prose

sys.path.insert(0, str(ROOT))  # bench/ lives at the repository root
sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # the docs' table directives (ladder_figures)

#: A number of a phrase: not part of a word ("p99"), a version, or a name.
NUMBER = re.compile(r"(?<![\w.])[-+−±]?\d[\d,]*(?:\.\d+)?(?![\d.]*\w)")

#: The page that ``make bench`` writes; the other pages quote it.
BENCH_PAGE = ROOT / "docs" / "benchmarks.md"


def numbers(text: str) -> list[float]:
    """The numbers of ``text``, as floats (thousands separators and the minus sign read)."""
    return [float(n.replace(",", "").replace("−", "-").replace("±", "")) for n in NUMBER.findall(text)]


# -- sources --------------------------------------------------------------------------------------------------

def bench_tables() -> dict[str, list[dict[str, str]]]:
    """``{section heading: rows}`` of docs/benchmarks.md's tables, each row ``{column: cell}``."""
    tables: dict[str, list[dict[str, str]]] = {}
    section = ""
    header: Optional[list[str]] = None
    for line in BENCH_PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
            continue
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            tables.setdefault(section, []).append(dict(zip(header, cells)))
    return tables


@dataclass(frozen=True)
class Bench:
    """Quoted from the benchmarks page: the row of ``section`` whose first cell starts with ``row``."""

    section: str
    row: str
    columns: tuple[str, ...] = ()

    def check(self, phrase: str) -> None:
        table = [r for title, rows in bench_tables().items() if title.startswith(self.section) for r in rows]
        rows = [r for r in table if next(iter(r.values())) == self.row] or \
            [r for r in table if next(iter(r.values())).startswith(self.row)]
        assert len(rows) == 1, f"docs/benchmarks.md, {self.section!r}: {len(rows)} row(s) start with {self.row!r}"
        cells = [rows[0][c] for c in self.columns] if self.columns else list(rows[0].values())
        have = {n for cell in cells for n in numbers(cell)}
        missing = [n for n in numbers(phrase) if n not in have]
        assert not missing, (f"{phrase!r} quotes {missing}, which docs/benchmarks.md does not have in "
                             f"{self.section} / {self.row} {list(self.columns)}: {cells}")


def _snapshot_cap() -> int:
    """The snapshot stream's byte cap, in MiB (the control plane's table)."""
    from kombu_ladder.controlplane import SNAPSHOT_ARGUMENTS

    return int(SNAPSHOT_ARGUMENTS["x-max-length-bytes"]) >> 20  # type: ignore[call-overload]


@dataclass(frozen=True)
class Code:
    """Computed: ``values()`` are the numbers of the phrase, in order; ``holds()``, if given, is a claim."""

    values: Callable[[], Sequence[float]]
    holds: Optional[Callable[[], bool]] = None

    def check(self, phrase: str) -> None:
        assert numbers(phrase) == [float(v) for v in self.values()], (phrase, list(self.values()))
        assert self.holds is None or self.holds(), f"the claim of {phrase!r} does not hold"


@dataclass(frozen=True)
class Asserted:
    """A bound a test asserts: each number (times ``scale``, unsigned) is a literal in ``path``'s source."""

    path: str
    scale: float = 1.0

    def check(self, phrase: str) -> None:
        paths = sorted((ROOT / self.path).rglob("*.py")) if (ROOT / self.path).is_dir() else [ROOT / self.path]
        literals = {abs(float(node.value)) * self.scale for path in paths
                    for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
                    and not isinstance(node.value, bool)}
        missing = [n for n in numbers(phrase) if not any(abs(abs(n) - lit) < 1e-9 for lit in literals)]
        assert not missing, f"{phrase!r}: {missing} is no bound of {self.path}"


@dataclass(frozen=True)
class Label:
    """A number that is no measurement: a release in a table's header, a parameter of a proposed design."""

    why: str

    def check(self, phrase: str) -> None:
        assert self.why


Source = Union[Bench, Code, Asserted, Label]


@dataclass(frozen=True)
class Figure:
    """``phrase`` (whitespace as on the page, or a regular expression with ``pattern``) on ``page``, and where
    its figures come from."""

    page: str
    phrase: str
    source: Source
    pattern: bool = field(default=False)

    @property
    def id(self) -> str:
        return f"{self.page}: {self.phrase[:60]}"


# -- what the figures come from -------------------------------------------------------------------------------

def _plan() -> Any:
    from kombu_ladder import plan

    return plan


def _relay_guess() -> int:
    from kombu_ladder.relay.holder import GUESS_BYTES

    return GUESS_BYTES


def _last_hour() -> list[float]:
    from kombu_ladder.plan import hops_for

    per_rung = sorted(Counter(hops_for(3600 - 0.010)).items(), reverse=True)
    shown = {3600: 1, 600: 10, 60: 1, 10: 10, 1: 1}  # "1 h", "10 min", "1 min", "10 s", "1 s"
    return [3, 1, *(x for rung, count in per_rung for x in (count, shown[rung]))]


def _forecast(hours: float, lag: int) -> tuple[tuple[int, ...], int]:
    from kombu_ladder.plan import HOLD_WINDOW, forecast

    return forecast(round(hours * 3600 * 1000), lag_ms=lag, hold_window_ms=round(HOLD_WINDOW * 1000))


def _first_step_down(lag: int) -> int:
    """The shortest whole number of hours after which a delay with ``lag`` ms a hop steps below the 1 h rung."""
    return next(h for h in range(1, 24 * 60) if min(_forecast(h, lag)[0]) < 3600)


def _buckets() -> list[float]:
    """The lateness buckets' positive bounds as the page writes them: ms below a second, s below an hour, h."""
    from kombu_ladder.observe import LATENESS_BUCKETS

    shown = []
    for bound in sorted(b for b in LATENESS_BUCKETS if b > 0):
        shown.append(bound * 1000 if bound < 1 else bound if bound < 3600 else bound / 3600)
    return shown


def _cancel_record_bytes() -> list[float]:
    from kombu_ladder.cancellation.records import encode

    return [len(encode("0" * 36, at=1_800_000_000_000, due=1_800_000_360_000)), 36]


def _hops_lag() -> list[float]:
    from ladder_figures import HOPS_LAG_MS  # docs/_ext

    page = (ROOT / "docs" / "operations.rst").read_text()
    assert f":lag-ms: {HOPS_LAG_MS}" in page, "the hops table and the sentence above it use the same lag"
    return [HOPS_LAG_MS]


def _bomb() -> list[float]:
    from hostile_corpus import BOMB, bomb

    return [BOMB / 2**20, round(len(bomb()) / 1024)]


def _matrix_rows_match_ci() -> bool:
    """The compatibility page's matrix lists .ci/matrix.py's stacks, with their Python and pinned versions."""
    sys.path.insert(0, str(ROOT / ".ci"))
    from matrix import STACKS

    text = (ROOT / "docs" / "compatibility.rst").read_text()
    rows = re.findall(r"\* - ``(celery[\d.]+)``\n\s+- (\S+)\n\s+- (\S+)\n\s+- (\S+)\n\s+- (\S+)\n\s+- (\S+)", text)
    shown = {name: dict(zip(("python", "celery", "kombu", "amqp", "django"), cells)) for name, *cells in rows}
    assert set(shown) == {s.name for s in STACKS}, (sorted(shown), [s.name for s in STACKS])
    for stack in STACKS:
        pins = dict(pin.split("==") for pin in stack.pins)
        assert shown[stack.name]["python"] == stack.python, stack.name
        for name, version in pins.items():
            assert shown[stack.name][name] == version, (stack.name, name, version, shown[stack.name])
    return True


SEC1, SEC2, SEC5, SEC6, SEC7 = ("1. Lateness", "2. Worker footprint", "5. Scale", "6. Cancellations",
                                "7. Round delays")
SEC12 = "12. The index's store at scale"
TEST_ON_TIME = "tests/broker/test_on_time.py"

#: Every figure of every page, and its source.
def _codec() -> Any:
    from kombu_ladder.controlplane import codec

    return codec


FIGURES: tuple[Figure, ...] = (
    # README.md
    Figure("README.md", "p99 5.3 ms late and the worst 34.8 ms", Bench(SEC1, "(b) kombu_ladder", ("p99", "max"))),
    Figure("README.md", "0 early, 600,000 of 600,000 arrived",
           Bench("Targets", "bursts: 50,000 due in one second", ("measured",))),
    Figure("README.md", "at 0.42× the broker alone (6,022/s), and one in a worker at 0.26× (3,742/s)",
           Bench("Targets", "bursts: one relay delivers ≥ 0.3×", ("measured",))),
    # why.rst: vanilla Celery and native delayed delivery, from the benchmarks
    Figure("why.rst", "pulled 3.2 tasks a second", Bench(SEC2, "vanilla", ("plain task sent after them",))),
    Figure("why.rst", "was **still waiting after 90 s**", Bench(SEC2, "vanilla", ("plain task sent after them",))),
    Figure("why.rst", "with the ladder it ran after 3.1 ms", Bench(SEC2, "Celery with the ladder")),
    Figure("why.rst", "grew by 2.3 MB while it held 331", Bench(SEC2, "vanilla", ("RSS growth",
                                                                                  "tasks held unacked"))),
    Figure("why.rst", "started p50 1.9 ms and at worst 9.7 ms", Bench(SEC1, "(e) Celery native", ("p50", "max"))),
    # celery.rst
    Figure("celery.rst", "started p50 4.1 ms and p99 7.6 ms", Bench(SEC1, "(d) Celery with the ladder",
                                                                     ("p50", "p99"))),
    # compatibility.rst
    Figure("compatibility.rst", r"\* - ``celery5\.\d``(\n\s+- \S+){5}", Code(lambda: [],
                                                                              holds=_matrix_rows_match_ci),
           pattern=True),
    Figure("compatibility.rst", "     - 4.3.6", Label("a RabbitMQ release, a column of the broker table")),
    Figure("compatibility.rst", "-0.02 s to +1.5 s", Asserted("tests/celery_tier/test_celery_native_delayed.py")),
    # the relay's byte budget for held messages (issue 28)
    Figure("how.rst", "(64 MiB by default)", Code(lambda: [_plan().HOLD_BYTES >> 20])),
    Figure("how.rst", "capped at 256 MiB", Code(lambda: [_snapshot_cap()])),
    Figure("how.rst", "1,000 entries, 256 KiB",
           Code(lambda: [_codec().MAX_PART_ENTRIES, _codec().MAX_PART_BYTES >> 10])),
    Figure("operations.rst", "(at most 256 MiB)", Code(lambda: [_snapshot_cap()])),
    Figure("how.rst", "(1 MiB before the first)", Code(lambda: [_relay_guess() >> 20])),
    Figure("guarantees.rst", "(64 MiB by default)", Code(lambda: [_plan().HOLD_BYTES >> 20])),
    Figure("guarantees.rst", "limited to 400 MB", Asserted("tests/broker/test_relay_memory.py")),
    Figure("guarantees.rst", "2,000 bodies of 256 KiB due 8 s ahead", Asserted("tests/broker/test_relay_memory.py")),
    Figure("guarantees.rst", "400 bodies\nof 1 MiB", Asserted("tests/broker/test_relay_memory.py")),
    # guarantees.rst
    Figure("guarantees.rst", r"255 bytes", Code(lambda: __import__("kombu_ladder.targets").targets.MAX_NAME and
                                                [__import__("kombu_ladder.targets").targets.MAX_NAME]),
           pattern=True),
    Figure("guarantees.rst", "256 MiB from 255 KiB", Code(_bomb)),
    Figure("guarantees.rst", "a stream of 100 kB", Asserted("tests/broker/test_unenforced.py", scale=1 / 1000)),
    Figure("guarantees.rst", "with a 0.5 s timeout", Asserted("tests/broker/test_metrics_server.py")),
    # how.rst: the worked examples, computed
    Figure("how.rst", "10 ms late: at 12:00:00.010", Code(lambda: [10, 12, 0, 0.010])),
    Figure("how.rst", "59 min 59.99 s", Code(lambda: [59, round(60 - 0.010, 2)])),
    Figure("how.rst", "(3 × 1 h, then 5 × 10 min, 9 × 1 min, 5 × 10 s, 9 × 1 s)", Code(_last_hour)),
    Figure("how.rst", "arrives about 12 ms late", Code(lambda: [_forecast(4, 3)[1]])),
    Figure("how.rst", "is 20 ms, or 25 millionths of the rung when that is more (90 ms for the 1 h rung)",
           Code(lambda: [__import__("kombu_ladder.plan").plan.TOLERANCE_MIN_MS,
                         __import__("kombu_ladder.plan").plan.TOLERANCE_PPM,
                         __import__("kombu_ladder.plan").plan.tolerance_ms(3600), 1])),
    Figure("how.rst", "24 one-hour hops at 3 ms each arrive 72 ms late",
           Code(lambda: [len(_forecast(24, 3)[0]), 3, _forecast(24, 3)[1]])),
    Figure("how.rst", "with a 3 ms lag no plan of 24 h in 25 placements or fewer arrives within 50 ms",
           Code(lambda: [3, 24, 25, __import__("bench.rounds").rounds.LATEST_MS])),
    Figure("how.rst", "(a 72 ms error over a day is under 1 ppm)",
           Code(lambda: [_forecast(24, 3)[1], 1], holds=lambda: _forecast(24, 3)[1] / 86_400_000 * 1e6 < 1)),
    Figure("how.rst", "(from a delay of 20 h at 5 ms a hop, 32 h at 3 ms)",
           Code(lambda: [_first_step_down(5), 5, _first_step_down(3), 3])),
    Figure("how.rst", "between −5 ms and +50 ms", Asserted(TEST_ON_TIME, scale=1000)),
    Figure("how.rst", "about 108 bytes (for a 36-character id", Code(_cancel_record_bytes)),
    # how.rst: the control plane's records, their limits from the codec's table
    Figure("how.rst", "1,000 ids, 64 KiB", Code(lambda: [_codec().MAX_CANCEL_IDS, _codec().MAX_CANCEL_BYTES >> 10])),
    Figure("how.rst", "1,000 entries, 1 MiB", Code(lambda: [_codec().MAX_ENTRIES, _codec().MAX_INDEX_BYTES >> 20])),
    Figure("how.rst", r"- 4 KiB", Code(lambda: [_codec().MAX_SMALL_BYTES >> 10]), pattern=True),
    Figure("how.rst", "1,000,000 records ever written, 10,000 of them within what it reads back, started in 0.48 s",
           Bench(SEC6, "relay start, 1,000,000 records ever written")),
    Figure("how.rst", "1,000,000 records took 44.05 s (22,701 records/s)",
           Bench(SEC6, "relay start, 1,000,000 records")),
    Figure("how.rst", "hopped 3,994 messages/s against 3,815 with none", Bench(SEC6, "hops/s")),
    Figure("how.rst", "started in 0.61 s (median of five)", Bench(SEC6, "relay start from a snapshot")),
    Figure("how.rst", "reconnected in 0.05 s", Bench(SEC6, "relay reconnect")),
    Figure("how.rst", "took 43.24 s on the same stream",
           Bench(SEC6, "relay start reading the last day back")),
    Figure("how.rst", "about 72.3 bytes of memory", Bench(SEC12, "memory per live cancellation")),
    Figure("how.rst", "1,000,000 live cancellations take 68.9 MiB", Bench(SEC12, "memory per live cancellation")),
    Figure("waiting.rst", "2,000,000 entries it took 0.54 GB (267.6 bytes an entry)", Bench(SEC12, "the SQLite file")),
    Figure("waiting.rst", "wrote 4,461 entries/s", Bench(SEC12, "entries added")),
    Figure("waiting.rst", "(0.04 ms)", Bench(SEC12, "find")),
    Figure("waiting.rst", "a count by task name 22.05 ms", Bench(SEC12, "count by task")),
    Figure("waiting.rst", "overview 94.67 ms", Bench(SEC12, "console page: overview")),
    # web.rst
    Figure("web.rst", "bodies are cut to 4 KiB",
           Code(lambda: [__import__("kombu_ladder.web.preview").web.preview.PREVIEW_BYTES / 1024])),
    # operations.rst
    Figure("operations.rst", "every expiry 5 ms late", Code(_hops_lag)),
    Figure("operations.rst", "bounds at ±1, ±2.5, ±5, ±10, ±25, ±50, ±100, ±250, ±500 ms, ±1, ±2.5, ±5, ±10, "
                             "±60 s and ±1 h", Code(_buckets)),
    Figure("operations.rst", "scrapes a relay 50 times a second for 10 s against a 2 s interval",
           Asserted("tests/broker/test_metrics.py")),
    Figure("operations.rst", "at about 20 a second", Code(
        lambda: [20], holds=lambda: "at about 20 a second" in (ROOT / "bench" / "dashboard.py").read_text())),
    Figure("operations.rst", "added 500 MB", Bench(SEC5, "broker total memory")),
    Figure("operations.rst", "114 MB of it message bytes", Bench(SEC5, "message bytes held in RAM")),
    Figure("operations.rst", r"^ +- (3\.10|4\.3)$", Label("RabbitMQ releases, the header of the 4.x table"),
           pattern=True),
    # native-delays.rst (a design note)
    Figure("native-delays.rst", "one message due 500 ms ahead", Label("the proposed probe's delay: a design")),
    # quickstart.rst
    Figure("quickstart.rst", "(the tests allow 0.3 s)", Code(lambda: [VARYING[0].within])),
    # simulator.rst
    Figure("simulator.rst", "never blocks for more than 50 ms of real time",
           Code(lambda: [__import__("kombu_ladder.simulator.transport").simulator.transport.Transport.max_block
                         * 1000])),
)


def _coverage(page: Path) -> tuple[str, list[tuple[int, int, Figure]]]:
    """The page's prose, normalized, and the spans each figure entry covers in it."""
    text = prose(page)
    flat, _ = normalized(text)
    spans = []
    for figure in (f for f in FIGURES if f.page == page.name):
        if figure.pattern:
            spans += [(m.start(), m.end(), figure) for m in re.finditer(figure.phrase, text, re.M)]
        else:
            start = flat.find(" ".join(figure.phrase.split()))
            while start >= 0:
                spans.append((start, start + len(" ".join(figure.phrase.split())), figure))
                start = flat.find(" ".join(figure.phrase.split()), start + 1)
    return text, spans


PAGES = [p for p in DOC_FILES if p != BENCH_PAGE]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_measured_figure_on_a_page_has_a_source(page: Path) -> None:
    text, spans = _coverage(page)
    flat, origin = normalized(text)
    position = {o: i for i, o in enumerate(origin)}
    uncovered = []
    for flag in flags(page):
        if any(figure.pattern and start <= flag.start < end for start, end, figure in spans):
            continue
        at = position.get(flag.start)
        if at is not None and any(not figure.pattern and start <= at < end for start, end, figure in spans):
            continue
        uncovered.append(f"line {flag.line}: {flag.text!r}")
    assert not uncovered, (
        f"docs/{page.name} shows figures with no source a test checks: {uncovered}. Quote docs/benchmarks.md, "
        "compute it from the code, state a test's bound, or write it without a number; then add the phrase to "
        "FIGURES in tests/unit/test_page_figures.py")


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.id)
def test_every_figure_agrees_with_its_source(figure: Figure) -> None:
    page = next(p for p in DOC_FILES if p.name == figure.page)
    text, spans = _coverage(page)
    found = [(start, end) for start, end, f in spans if f is figure]
    assert found, f"{figure.phrase!r} is no longer on {figure.page}: update FIGURES"
    if figure.pattern:
        for start, end in found:
            figure.source.check(text[start:end] if not isinstance(figure.source, Code) or figure.source.values()
                                else "")
    else:
        figure.source.check(figure.phrase)


def test_a_stale_quote_fails() -> None:
    """The check would have caught the README's old claim, and a figure that drifted from the benchmarks."""
    with pytest.raises(AssertionError, match="does not have"):
        Bench(SEC1, "(b) kombu_ladder", ("p99", "max")).check("p99 2.1 ms late and the worst 111 ms")
    with pytest.raises(AssertionError):
        Code(lambda: [_forecast(4, 3)[1]]).check("arrives about 15 ms late")
    with pytest.raises(AssertionError, match="no bound"):
        Asserted(TEST_ON_TIME, scale=1000).check("between −5 ms and +20 ms")


def test_the_old_hops_table_would_fail() -> None:
    """The operations page's former table (5 s: 3, 30 s: 10, 90 s: 11, 4 h: 30, 1 day: 50, 7 days: 194 hops) is
    not what the code forecasts; the page now builds the table from the forecast itself."""
    from ladder_figures import relay_hops

    old = {5: 3, 30: 10, 90: 11, 4 * 3600: 30, 86400: 50, 7 * 86400: 194}
    assert {d: relay_hops(d) for d in old} != old
    assert {d: relay_hops(d) for d in old} == {5: 0, 30: 1, 90: 2, 4 * 3600: 3, 86400: 41, 7 * 86400: 185}
