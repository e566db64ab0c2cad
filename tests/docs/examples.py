"""The code examples of the documentation pages (docs/**/*.md), as the docs tests run them.

Conventions a page follows (visible to its readers, so nothing is skipped silently):

- A fenced block with a ``title="NAME"`` (```yaml title="const.yaml"```) is a file: it is written
  to ``NAME`` in the page's working folder, never executed.
- A ```python block without a title runs; all of a page's blocks run in order, in one process,
  sharing one namespace (a tutorial builds on its earlier steps).
- A ```bash block runs with ``bash -euo pipefail`` in the same folder when every command in it
  starts with ``ckptstore``, ``python``, ``python3`` or ``export``.
- A page whose examples use ``$DATABASE_URL`` gets a fresh database on the test PostgreSQL server
  there; ``s3://``, ``gs://`` and ``az://`` buckets they name are created on the emulators.
- A python or bash block whose first line is ``# not run: <why>`` is shown and counted, not run
  (a cluster address, a real cloud account). A bash block that calls anything else must say so,
  or the test fails.

Each page runs in a fresh folder with ``CKPTSTORE_HOME`` there (so the default storage and
registry are the page's own) and the repository's ``examples/`` linked in.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOT_RUN = "# not run:"
RUNNABLE_COMMANDS = frozenset({"ckptstore", "python", "python3", "export"})

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)(?P<attrs>[^\n]*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int
    lang: str
    code: str
    title: str | None

    @property
    def not_run_reason(self) -> str | None:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        return first[len(NOT_RUN) :].strip() if first.startswith(NOT_RUN) else None

    @property
    def kind(self) -> str:
        """``file``, ``python``, ``bash``, ``not-run`` or ``text`` (anything else: shown only)."""
        if self.title:
            return "file"
        if self.lang in ("python", "bash") and self.not_run_reason is not None:
            return "not-run"
        if self.lang in ("python", "bash"):
            return self.lang
        return "text"


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of one Markdown page, in order."""
    lines = path.read_text().splitlines()
    page = str(path.relative_to(DOCS))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match or not match["lang"]:
            i += 1
            continue
        indent, start = len(match["indent"]), i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = "\n".join(line[indent:] for line in lines[start:end])
        title = _TITLE.search(match["attrs"])
        found.append(Block(page, start, match["lang"], body + "\n", title and title["title"]))
        i = end + 1
    return found


def bash_commands(code: str) -> list[str]:
    """The commands of a bash block (continuations joined, comments dropped)."""
    joined = code.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def unrunnable_bash(block: Block) -> list[str]:
    """Commands of a runnable-looking bash block that the docs test cannot run."""
    bad = []
    for command in bash_commands(block.code):
        words = shlex.split(command)
        # `VAR=value cmd ...`: the command is the first word that is not an assignment.
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if not words or words[0] not in RUNNABLE_COMMANDS:
            bad.append(command)
    return bad


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))
