"""The human report as plain text, without importing rich (~25 ms of every text `validate`).

When the output is not a terminal, rich writes no colour or control codes: what it prints is
its table, word-wrapped lines and nothing else. `render` writes the same bytes for the reports
it can be sure of: printable ASCII without markup-like brackets, backslashes or `:name:` emoji
codes, tabs or newlines, and a table that fits the width. For anything else it returns None
and the caller renders with rich (tests/report/test_plain.py compares the two).
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import TextIO

from exl3tool.report.model import Report
from exl3tool.rules.registry import Finding, Severity

TITLE = "exl3tool report"
HEADERS = ("artifact", "kind", "errors", "warnings", "infos")
_RIGHT = (False, False, True, True, True)  # the counts are right-justified

# What rich would change or measure differently: non-ASCII or control characters, a bracket
# that may open a markup tag, a backslash (markup escapes), `:...:` (emoji codes).
_UNSURE = re.compile(r"[^\x20-\x7e]|\[[a-zA-Z#/@]|\\|:\S*?:")
_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap.re_word


class Unsure(Exception):
    """The report holds text that only rich renders exactly."""


def plain_width(stream: TextIO | None) -> int | None:
    """The width rich's `Console()` would wrap `stream` at, when it would write plain text to
    it (not a terminal, not Jupyter, UTF-8, not Windows); else None."""
    env = os.environ
    if stream is None or sys.platform == "win32" or hasattr(builtins, "get_ipython"):
        return None
    if "FORCE_COLOR" in env or "TTY_COMPATIBLE" in env:
        return None
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    if not (getattr(stream, "encoding", None) or "utf-8").lower().startswith("utf"):
        return None  # rich draws the table in ASCII then
    width = None
    for fd in (0, 1, 2):  # rich's Console.size: the first standard stream that is a terminal
        try:
            width = os.get_terminal_size(fd)[0]
            break
        except (AttributeError, ValueError, OSError):
            pass
    columns = env.get("COLUMNS")
    if columns is not None and columns.isdigit():  # taken as is: rich prints nothing at 0
        return int(columns) or None
    return width or 80


def _checked(text: str) -> str:
    if _UNSURE.search(text):
        raise Unsure(text)
    return text


def wrap(line: str, width: int) -> list[str]:
    """`line` word-wrapped as rich wraps printable ASCII (rich._wrap.divide_line, then
    Text.wrap's rstrip_end and fold truncation)."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(line):
        start, word = match.start(), match.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:  # folded across lines
            chunks = [word[i : i + width] for i in range(0, len(word), width)]
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    out = []
    for a, b in zip([0, *breaks], [*breaks, len(line)], strict=True):
        piece = line[a:b]
        if len(piece) > width:
            stripped = piece.rstrip()
            piece = piece[: max(len(stripped), width)]
        out.append(piece[:width])
    return out


def _table(report: Report, width: int) -> list[str]:
    rows = []
    for a in report.artifacts:
        mine = [
            f
            for f in report.findings
            if len(report.artifacts) == 1 or (f.location.file or "").startswith(a.path)
        ]
        counts = [sum(1 for f in mine if f.level is sev) for sev in Severity]
        rows.append((_checked(a.path), _checked(a.kind), *(str(n) for n in counts)))
    if not rows:
        raise Unsure("no artifacts")
    cols = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    total = sum(cols) + 3 * len(cols) + 1
    if total > width:
        raise Unsure("the table would be wrapped")

    def line(cells: tuple[str, ...], edge: str) -> str:
        just = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, cols, _RIGHT, strict=True)
        ]
        return edge + edge.join(f" {c} " for c in just) + edge

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in cols) + right

    pad = total - len(TITLE)
    return [
        " " * (pad // 2) + TITLE + " " * (pad - pad // 2),
        rule("┏", "━", "┳", "┓"),
        line(HEADERS, "┃"),
        rule("┡", "━", "╇", "┩"),
        *(line(r, "│") for r in rows),
        rule("└", "─", "┴", "┘"),
    ]


def _finding_lines(f: Finding) -> list[str]:
    where = " ".join(
        x
        for x in (
            f.location.tensor and f"tensor {f.location.tensor}",
            f.location.pointer and f"at {f.location.pointer}",
        )
        if x
    )
    head = f"  {f.level.value:7} {f.code} {f.message}" + (f" ({where})" if where else "")
    return [_checked(head), _checked(f"          fix: {f.hint}")]


def render(report: Report, width: int, quiet: bool = False) -> str | None:
    """What `report.text` prints with rich at `width` columns, or None when unsure."""
    try:
        return "".join(line + "\n" for line in _lines(report, width, quiet))
    except Unsure:
        return None


def _lines(report: Report, width: int, quiet: bool) -> list[str]:
    s = report.summary()
    logical: list[str] = []
    out: list[str] = []
    if not quiet:
        out += _table(report, width)
        logical += [_checked(f"note: {note}") for note in report.notes]
    by_file: dict[str, list[Finding]] = {}
    for f in report.findings:
        if quiet and f.level is not Severity.ERROR:
            continue
        by_file.setdefault(f.location.file or "(artifact)", []).append(f)
    for file, items in by_file.items():
        logical += ["", _checked(file)]
        for f in sorted(items, key=lambda f: (-f.level.rank, f.code)):
            logical += _finding_lines(f)
    verdict = "FAILED" if s["errors"] else "OK"
    logical += [
        "",
        f"{verdict}: {s['errors']} errors, {s['warnings']} warnings, {s['infos']} infos",
    ]
    for line in logical:
        out += wrap(line, width)
    return out
