"""`exl3tool diff A B`: which layers, tensors and K values differ between two artifacts (or
identity records written by `exl3tool identity --format json`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.actions.inputs import resolve_input
from exl3tool.io.gcpause import paused_gc
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings

_CONFIGS = ("adapter_config.json", "config.json", "quantization_config.json")


@dataclass(frozen=True)
class Options:
    a: str
    b: str
    algo: str | None = None  # default: the records' algorithm, else blake3
    threads: int | None = None


@dataclass(frozen=True)
class DiffResult:
    a: str
    b: str
    diff: Any  # identity.compare.Diff
    errors: Findings  # container errors of either artifact: the comparison is not conclusive

    @property
    def conclusive(self) -> bool:
        return not self.errors

    def exit_code(self) -> int:
        return 0 if self.conclusive and self.diff.identical else 1

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, **self.diff.to_json(), "conclusive": self.conclusive}


def _record_or_none(path: Path) -> dict[str, Any] | None:
    """An identity document when `path` is one; None for an artifact."""
    if not (path.is_file() and path.suffix == ".json") or path.name in _CONFIGS:
        return None
    from exl3tool.identity.compare import load_record
    from exl3tool.identity.fast import SCHEMA

    findings = Findings()
    doc = load_record(path, findings)
    if doc is None:
        raise InputError(f"{path}: not an {SCHEMA} document ({next(iter(findings)).message})")
    return doc


def _identity_doc(path: Path, algo: str, threads: int | None) -> tuple[dict[str, Any], Findings]:
    """The identity of `path` and its container errors (then it is not trusted)."""
    from exl3tool.actions.identity import hash_artifact
    from exl3tool.actions.inputs import anchor, check_readable

    check_readable(path)
    hashed = hash_artifact(path, algo, None, threads, None)
    with paused_gc():  # two dicts per tensor
        doc = hashed.identity.to_json()
    return doc, anchor(path, Findings(hashed.container.errors()))


def run(opts: Options) -> DiffResult:
    from exl3tool.identity.compare import diff
    from exl3tool.identity.engine import check_algo

    if opts.algo is not None:
        check_algo(opts.algo)
    check_counts(None, opts.threads)
    pa, pb = resolve_input(opts.a), resolve_input(opts.b)
    ra, rb = _record_or_none(pa), _record_or_none(pb)
    algos = {r["algorithm"] for r in (ra, rb) if r is not None}
    if opts.algo is not None:
        algos.add(opts.algo)
    if len(algos) > 1:
        raise UsageError(f"cannot compare digests of different algorithms: {sorted(algos)}")
    use = algos.pop() if algos else "blake3"
    errors = Findings()
    docs = []
    for path, rec in ((pa, ra), (pb, rb)):
        if rec is None:
            rec, errs = _identity_doc(path, use, opts.threads)
            errors.extend(errs)
        docs.append(rec)
    return DiffResult(opts.a, opts.b, diff(docs[0], docs[1]), errors)
