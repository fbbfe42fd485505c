"""Options shared by every family's checks (what `validate` was asked to do)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ValidateOptions:
    tp: int | None = None  # runtime TP size to check the artifact against
    hash: bool = False  # recompute every digest a manifest declares (sha256 over payloads)
    base: Path | None = None  # the base checkpoint a cartridge is checked against
    threads: int | None = None  # hashing threads (None = os.cpu_count())
    runtime: str = "auto"  # serving runtime revision to predict (checks/conformance.RUNTIMES)
