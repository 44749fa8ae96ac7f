"""Compare the output a page shows with what a run printed: every figure exact, or within a stated tolerance."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

__all__ = ["Varies", "VARYING", "FREE", "differences", "numbers_in", "Flag", "MEASURE", "CELL", "prose", "flags",
           "normalized"]

#: A number as a page or a command prints it: 1,307, -0.5, +22 (the sign kept).
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")

#: Tokens that are no figure: they differ on every run by nature (a clock time, a date, an id, a node).
FREE = {
    "<uuid>": re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"),
    "<time>": re.compile(r"\d\d:\d\d:\d\d(\.\d+)?"),
    "<timestamp>": re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?,?"),
    "<node>": re.compile(r"\S+@\S+?:?"),
}


@dataclass(frozen=True)
class Varies:
    """A figure a run cannot repeat exactly: in the output of ``command``, a token like ``token`` may differ
    from the page by ``within`` (absolute, in the token's own unit)."""

    command: str
    token: str
    within: float
    why: str
    #: The least value a run may print, whatever the page shows (None: no floor).
    at_least: Optional[float] = None

    def applies(self, command: str, token: str) -> bool:
        return bool(re.search(self.command, command)) and re.fullmatch(self.token, token) is not None


#: Every figure allowed to differ between a page and a run, and by how much. Anything else must be equal.
VARYING = (
    Varies(r"python examples/kombu_(scheduler|republish)\.py", r"\d+\.\ds", 0.3,
           "seconds since the first publish: the relay delivers at the due time, and the process and the "
           "broker share a loaded machine"),
    Varies(r"^make demo", r"[-+]\d+ms", 250.0,
           "lateness in ms: never early; within a few ms on a quiet machine, tens of ms when the machine is "
           "loaded, about a hundred when CI runs four test lanes on two cores (docs/benchmarks.md has the "
           "distribution)", at_least=0.0),
    Varies(r"^kombu-ladder find ", r"\d+\.\d", 60.0,
           "seconds until the message is due: the page's message was published 7,200 s ahead, some seconds "
           "before the command runs"),
    Varies(r"^kombu-ladder find ", r"\d+\.\d\d", 2.0, "seconds the scan took"),
)


def _free(token: str) -> Optional[str]:
    return next((name for name, pattern in FREE.items() if pattern.fullmatch(token)), None)


def numbers_in(token: str) -> tuple[str, list[float]]:
    """``token``'s skeleton (numbers replaced by ``<n>``) and its numbers."""
    numbers = [float(n.replace(",", "")) for n in NUMBER.findall(token)]
    return NUMBER.sub("<n>", token), numbers


def _compare(command: str, shown: str, printed: str, varying: Sequence[Varies]) -> Optional[str]:
    free = _free(shown)
    if free is not None:
        return None if _free(printed) == free else f"{printed!r} is no {free} as {shown!r} is"
    skeleton, expected = numbers_in(shown)
    printed_skeleton, actual = numbers_in(printed)
    if skeleton != printed_skeleton:
        return f"{printed!r} where the page shows {shown!r}"
    rule = next((v for v in varying if v.applies(command, shown)), None)
    within = rule.within if rule else 0.0
    for want, got in zip(expected, actual):
        if rule is not None and rule.at_least is not None and got < rule.at_least:
            return f"{printed!r} is below {rule.at_least:g}, the least a run may print ({rule.why})"
        if abs(want - got) > within + 1e-9:
            tolerance = f"more than {rule.within:g} off ({rule.why})" if rule else "a figure that must be equal"
            return f"{printed!r} where the page shows {shown!r}: {tolerance}"
    return None


def differences(command: str, shown: Sequence[str], printed: str,
                varying: Sequence[Varies] = VARYING) -> list[str]:
    """How the page's lines ``shown`` under ``command`` differ from what it ``printed`` (empty: they agree).

    Lines are compared token by token, blank lines ignored. A clock time, an id or a node
    name may differ; a figure must be equal unless :data:`VARYING` says by how much it may
    differ in that command's output.
    """
    expected = [line.split() for line in shown if line.strip()]
    actual = [line.split() for line in printed.splitlines() if line.strip()]
    if len(expected) != len(actual):
        return [f"the page shows {len(expected)} line(s), the command printed {len(actual)}"]
    found = []
    for number, (want, got) in enumerate(zip(expected, actual), 1):
        if len(want) != len(got):
            found.append(f"line {number}: {' '.join(got)!r} where the page shows {' '.join(want)!r}")
            continue
        found += [f"line {number}: {problem}" for problem in
                  (_compare(command, w, g, varying) for w, g in zip(want, got)) if problem]
    return found


# -- the figures of a page's prose -------------------------------------------------------------------------

#: A measured figure in prose: a number with a unit of time below a second, of memory, a rate, a ratio or a
#: share, or seconds with a decimal point. (Delays and rung lengths, "a 4 h delay", are inputs, not figures.)
_UNIT = (r"(?:ms|µs|MB|GB|KB|kB|KiB|MiB|GiB|bytes?|%|×|ppm|/s|per second|a second|messages/s|records/s|hops/s|"
         r"msg/s)")
MEASURE = re.compile(r"(?<![\w.\x00])[-+−±]?\d[\d,]*(?:\.\d+)?\s?" + _UNIT + r"(?![\w])"
                     r"|(?<![\w.\x00])\d[\d,]*(?:\.\d+)?\s[a-z]+\s(?:a|per) second\b"
                     r"|(?<![\w.\x00])[-+−±]?\d[\d,]*\.\d+\s?(?:s|seconds|min|minutes|h|hours)\b")
#: A list-table cell that is only a figure with a decimal point, a thousands separator or a unit.
CELL = re.compile(r"^\s*(?:\* )?- (?P<cell>[-+−]?(?:\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+)(?:\s?(?:s|ms|%|×))?"
                  r"|[-+−]?\d+\s?(?:ms|%|×))\s*$", re.M)


@dataclass(frozen=True)
class Flag:
    """A figure found in a page's prose: its line and its text."""

    page: str
    line: int
    text: str
    start: int  # offset in :func:`prose`'s normalized text


def _blank(text: str, start: int, end: int) -> str:
    """``text`` with ``[start, end)`` replaced by as many newlines as it held (line numbers stay)."""
    return text[:start] + "\n" * text.count("\n", start, end) + text[end:]


def prose(path: Any) -> str:
    """A page's text without its code: code blocks, literal blocks, included files and doctests are blanked
    (their output is checked elsewhere); inline literals stay, marked, and are never scanned for figures."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        for match in reversed(list(re.finditer(r"^```.*?^```", text, re.M | re.S))):
            text = _blank(text, match.start(), match.end())
        return text
    lines = text.split("\n")
    out: list[str] = []
    skip: Optional[int] = None
    in_doctest = False
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip is not None:
            if stripped and indent <= skip:
                skip = None
            else:
                out.append("")
                continue
        if in_doctest:
            if not stripped:
                in_doctest = False
            out.append("")
            continue
        if stripped.startswith(">>>"):
            in_doctest = True
            out.append("")
            continue
        if re.match(r"\.\. (code-block|literalinclude|include|image|highlight|ladder-\w+)::", stripped):
            skip = indent
            out.append("")
            continue
        if re.match(r":[\w -]+:(\s|$)", stripped):  # a directive's option or a field: no prose
            out.append("")
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            skip = indent
            out.append(line[:-1])
            continue
        out.append(line)
    return "\n".join(out)


def _literals(text: str, markdown: bool) -> list[tuple[int, int]]:
    pattern = r"(?<!`)`[^`\n]+`(?!`)" if markdown else r"``.+?``|:\w+:`[^`]+`"
    return [(m.start(), m.end()) for m in re.finditer(pattern, text, re.S)]


def flags(path: Any) -> list[Flag]:
    """Every measured-looking figure of a page's prose (:data:`MEASURE`, :data:`CELL`), outside literals."""
    text = prose(path)
    scan = text
    for start, end in _literals(text, path.suffix == ".md"):
        scan = scan[:start] + "".join(c if c == "\n" else "\x00" for c in scan[start:end]) + scan[end:]
    found = [Flag(path.name, scan.count("\n", 0, m.start()) + 1, m.group(0), m.start()) for m in MEASURE.finditer(scan)]
    found += [Flag(path.name, scan.count("\n", 0, m.start("cell")) + 1, m.group("cell"), m.start("cell"))
              for m in CELL.finditer(scan)]
    return sorted(set(found), key=lambda f: f.start)


def normalized(text: str) -> tuple[str, list[int]]:
    """``text`` with every run of whitespace made one space, and for each of its characters the offset it
    came from."""
    out: list[str] = []
    origin: list[int] = []
    for i, char in enumerate(text):
        if char.isspace():
            if out and out[-1] == " ":
                continue
            char = " "
        out.append(char)
        origin.append(i)
    return "".join(out), origin
