"""Read a JSON document from disk strictly, turning every problem into a finding."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from exl3tool.io.fs import read_document
from exl3tool.io.gcpause import paused_gc
from exl3tool.io.strict_json import JsonIssue, loads
from exl3tool.rules import io as rules
from exl3tool.rules.registry import Findings

DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # identity records above it: identity/record_scan

_ISSUE_RULES = {
    "syntax": rules.JS_SYNTAX,
    "duplicate": rules.JS_DUPLICATE,
    "nonfinite": rules.JS_NONFINITE,
    "huge_int": rules.JS_HUGE_INT,
    "depth": rules.JS_DEPTH,
    "encoding": rules.JS_ENCODING,
}


# Issues after which loads() has no value; a bare `null` document parses fine and is
# reported below as "not an object" instead of vanishing without a finding.
_FATAL = frozenset(("syntax", "encoding", "depth", "huge_int"))


def report_issues(issues: list[JsonIssue], findings: Findings, label: str) -> None:
    for issue in issues:
        findings.add(_ISSUE_RULES[issue.kind], issue.message, file=label, pointer=issue.pointer)


def drop_rejected(value: Any, issues: list[JsonIssue]) -> Any:
    """`value` with every NaN/Infinity (reported as JS003) replaced by None, in place: a value
    the strict reader rejects never flows on into the checks (issue 15)."""
    if not any(i.kind == "nonfinite" for i in issues):
        return value
    return _drop(value)


def _drop(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        for k, x in v.items():
            v[k] = _drop(x)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            v[i] = _drop(x)
    return v


def read_json(
    path: Path,
    findings: Findings,
    label: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    require_object: bool = True,
) -> Any:
    """Parse `path`; report problems as findings on `label`. Returns None if unusable.

    Duplicate keys are reported but the (last-wins) value is still returned, so later checks
    can run; non-finite numbers are reported and returned as None (`drop_rejected`).
    """
    try:
        data = read_document(path, max_bytes)
    except ValueError as exc:
        findings.add(rules.JS_TOO_LARGE, f"JSON file too large: {exc}", file=label)
        return None
    except OSError as exc:  # present, but reading fails (EIO, EACCES, not a regular file)
        findings.add(rules.JS_UNREADABLE, f"cannot read it: {exc.strerror or exc}", file=label)
        return None
    return parse_json(data, findings, label, require_object=require_object)


def parse_json(data: bytes, findings: Findings, label: str, *, require_object: bool = True) -> Any:
    """`read_json` of a document already read."""
    with paused_gc():  # a document of 10^6 small objects and no cycle
        value, issues = loads(data)
    report_issues(issues, findings, label)
    value = drop_rejected(value, issues)
    if value is None and any(i.kind in _FATAL for i in issues):
        return None
    if require_object and not isinstance(value, dict):
        findings.add(
            rules.JS_NOT_OBJECT,
            f"expected an object, got {type(value).__name__}",
            file=label,
            pointer="",
        )
        return None
    return value
