"""Read the code blocks out of README.md and docs/: console sessions and Python snippets."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Command", "blocks", "commands_of", "inline_commands", "is_excerpt", "DOC_FILES", "ROOT"]

ROOT = Path(__file__).resolve().parent.parent

#: Every page a reader sees: the README and the Sphinx sources.
DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst")), *sorted((ROOT / "docs").glob("*.md")))

_RST_BLOCK = re.compile(r"^(?P<indent>[ \t]*)\.\. code-block:: *(?P<lang>\S+)\n(?:(?P=indent)[ \t]+:.*\n)*\n",
                        re.M)
_MD_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    """One code block of a page."""

    page: str
    line: int
    lang: str
    text: str

    @property
    def id(self) -> str:
        """``page:line``, for test ids and messages."""
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One ``$ command`` of a console block, with the output the page shows under it."""

    line: str
    output: tuple[str, ...] = field(default_factory=tuple)

    @property
    def argv(self) -> list[str]:
        """The command split as a shell would (the comment after ``#`` dropped)."""
        return shlex.split(self.line, comments=True)


def _rst_blocks(path: Path, text: str) -> list[Block]:
    found = []
    for match in _RST_BLOCK.finditer(text):
        indent = len(match.group("indent"))
        body: list[str] = []
        for line in text[match.end():].split("\n"):
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
        lines = [line for line in body]
        while lines and not lines[-1].strip():
            lines.pop()
        margin = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
        found.append(Block(path.name, text[:match.start()].count("\n") + 1, match.group("lang"),
                           "\n".join(line[margin:] for line in lines) + "\n"))
    return found


def blocks(lang: str) -> list[Block]:
    """Every ``lang`` block (``console``, ``python``...) of :data:`DOC_FILES`, in page order."""
    found: list[Block] = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".rst":
            found += [b for b in _rst_blocks(path, text) if b.lang == lang]
        else:
            found += [Block(path.name, text[:m.start()].count("\n") + 1, m.group("lang"), m.group("body"))
                      for m in _MD_FENCE.finditer(text) if m.group("lang") == lang]
    return found


def commands_of(block: Block) -> list[Command]:
    """The ``$`` commands of a console block (``\\`` continuations joined) and the output under each."""
    commands: list[Command] = []
    pending: list[str] = []
    output: list[str] = []
    line_of_command = ""
    for line in block.text.splitlines():
        if pending:
            pending.append(line.strip())
            if not line.rstrip().endswith("\\"):
                line_of_command, pending = " ".join(p.rstrip("\\").strip() for p in pending), []
            continue
        if line.startswith("$ "):
            if line_of_command:
                commands.append(Command(line_of_command, tuple(output)))
            output = []
            if line.rstrip().endswith("\\"):
                pending, line_of_command = [line[2:]], ""
            else:
                line_of_command = line[2:].strip()
        elif line_of_command:
            output.append(line)
    if line_of_command:
        commands.append(Command(line_of_command, tuple(output)))
    return commands


#: Inline literals that are commands a reader may copy: ``kombu-ladder ...``, ``celery -A proj ladder ...``.
_INLINE = re.compile(r"``((?:kombu-ladder|python -m kombu_ladder|celery -A \w+ (?:ladder|worker|inspect)|"
                     r"pip install)\b[^`]*)``")


def inline_commands() -> list[tuple[str, str]]:
    """``(page, command)`` for every inline command literal of :data:`DOC_FILES` (rST ``double`` and MD `single`)."""
    found = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8").replace("\n", " ")
        if path.suffix == ".md":
            text = re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)
        for match in _INLINE.finditer(text):
            found.append((path.name, " ".join(match.group(1).split())))
    return found


def is_excerpt(block: Block) -> bool:
    """A snippet marked, on its first line, as an excerpt of a larger file: compiled, not run."""
    first = next((line for line in block.text.splitlines() if line.strip()), "")
    return first.lstrip().lower().startswith("# excerpt")
