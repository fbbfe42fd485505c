"""The one check of the counts a user passes (`--tp`, `--threads`): each sizes processes,
threads or per-rank tables, so it is bounded before any work (UsageError, exit 2)."""

from __future__ import annotations

from exl3tool.rules.errors import UsageError

MAX_TP = 1024  # ranks: the gate config's maximum, beyond any deployment
MAX_THREADS = 1024  # workers: the gate config's maximum


def check_counts(tp: int | None, threads: int | None) -> None:
    """UsageError for a TP size or thread count below one or above its maximum."""
    for flag, value, most in (("--tp", tp, MAX_TP), ("--threads", threads, MAX_THREADS)):
        if value is not None and not 1 <= value <= most:
            raise UsageError(f"{flag} must be between 1 and {most}, got {value}")
